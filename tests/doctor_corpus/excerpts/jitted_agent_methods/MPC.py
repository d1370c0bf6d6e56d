import mindspore.numpy as mnp
from mindspore import nn, ms_function


class MPC(nn.Cell):
    @ms_function
    def sample(self, b, n):
        return self.sampler(b, n)

    @ms_function
    def test(self, targets, states):
        return self.scorer(targets, states)

    def n_steps(self, targets, states, origin_path, n):
        max_len, batch = origin_path.shape[1], targets.shape[0]
        for i in range(n):
            candidate_args = self.sample(batch, max_len - i)  # judged: mpc-MS003
            states_repeat = [s.repeat(self.hor, 1) for s in states]
            candidate_scores = self.test(targets, states_repeat)  # judged: mpc-MS017
            candidate_args = mnp.argmax(candidate_scores, axis=1)
        return candidate_args
