from mindspore.context import set_context, PYNATIVE_MODE
set_context(mode=PYNATIVE_MODE)
