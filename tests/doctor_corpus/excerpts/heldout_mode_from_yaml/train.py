from mindediting.utils.init_utils import init_env
from mindediting.models import create_model_by_name


def train(cfg):
    init_env(cfg)
    net = create_model_by_name(cfg.model.name, cfg)
    net.train(cfg.epochs)


if __name__ == "__main__":
    train(None)
