import random
from mindspore import nn, ops


class Discriminator(nn.Cell):
    def pool_query(self, pool_size, images):
        return_images = []
        for image in images:
            p = random.uniform(0, 1)  # judged: apdrawing-a
            if p > 0.5:
                random_id = random.randint(0, pool_size - 1)  # judged: apdrawing-b
                return_images.append(self.images[random_id])
            else:
                return_images.append(image)
        return ops.concat(return_images, 0)

    def construct(self, A, B):
        AB = self.pool_query(self.pool_size, ops.concat((A, B), 1))
        return self.net(AB)
