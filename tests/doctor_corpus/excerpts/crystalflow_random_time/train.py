import mindspore as ms
from models.flow_condition import CSPFlow


def main(args):
    ms.set_context(device_target=args.device_target, device_id=args.device_id)
    model = CSPFlow()
    grad_fn = ms.value_and_grad(model, None, model.trainable_params())

    @ms.jit
    def train_step(*batch):
        return grad_fn(*batch)


if __name__ == "__main__":
    main(None)
