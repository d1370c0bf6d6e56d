import mindspore
from mindnlp.core import ops


@mindspore.jit(jit_config=mindspore.JitConfig(jit_syntax_level='STRICT'))
def decode_one_tokens(model, cur_token, input_pos, cache_position, past_key_values):  # judged: mindnlp-llama2 mindnlp-llama2-2 mindnlp-llama2-3 mindnlp-tinyllama
    logits = model(cur_token, position_ids=input_pos, cache_position=cache_position,
                   past_key_values=past_key_values, return_dict=False, use_cache=True)[0]
    return ops.argmax(logits[:, -1], dim=-1)[:, None]


@mindspore.jit(jit_config=mindspore.JitConfig(jit_syntax_level='STRICT'))
def get_decode_one_tokens_logits(model, cur_token, input_pos, cache_position, past_key_values, temperature=0.6):  # judged: mindnlp-qwen-gradio mindnlp-qwen
    logits = model(cur_token, position_ids=input_pos, cache_position=cache_position,
                   past_key_values=past_key_values, return_dict=False, use_cache=True)[0]
    return logits / temperature
