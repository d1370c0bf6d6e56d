from mindspore import ms_function, ops


class Net:
    @ms_function
    def boundary_condition(self, *output, **kwargs):
        u = output[0]
        value = kwargs.get(self.bc_name)
        if value is not None:
            x = value[:, 0]
            y = value[:, 1]
        else:
            print("key doesn't exist")  # judged: mindelec
            return u
        return u - ops.sin(x) * ops.cos(y)
