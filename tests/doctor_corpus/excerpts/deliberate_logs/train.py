import mindspore as ms
ms.set_context(mode=0)
