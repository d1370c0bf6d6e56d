from mindspore import nn, ops

op_map = {}


def get_func_from_so(so_name, func_name):
    k = hash((so_name, func_name))
    op = ops.Custom(func_name, func_type="aot")
    op_map[k] = op  # judged: rcnn-MS001
    return op


class BallQuery(nn.Cell):
    def construct(self, xyz):
        return get_func_from_so("ball_query.so", "ball_query")(xyz)
