from mindspore import nn


class CrossEntropyLoss(nn.Cell):
    def construct(self, logits, label, input_mask):
        loss_reduce = self.loss(logits, label)
        if self.need_monitor:
            local_loss = self.div2(self.local_sum2(loss_reduce), self.local_sum2(input_mask))
            if self.monitor_local_loss:
                if self.dump_local_loss:
                    self.dump(self.local_loss_filename, local_loss)
                else:
                    print("local loss: ", local_loss)  # judged: mindformers-a mindformers-b
        return loss_reduce
