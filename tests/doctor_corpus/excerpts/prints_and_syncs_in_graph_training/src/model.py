from mindspore import nn


class AnalogyModel(nn.Cell):
    def construct(self, input_ids, label):
        mask_logits = self.model(input_ids)
        loss = self.loss_fn(mask_logits, label)
        print(loss)  # judged: mkg
        return loss
