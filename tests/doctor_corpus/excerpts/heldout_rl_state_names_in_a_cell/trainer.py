import mindspore as ms


class Trainer:
    @ms.jit
    def train_one_episode(self):
        return self.msrl.agent_learn(self.msrl.replay_buffer_sample())
