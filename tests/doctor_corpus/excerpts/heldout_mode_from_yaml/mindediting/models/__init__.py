from mindediting.models.mutil_task.ipt_trainer import IPTTrainStep
from mindediting.models.mutil_task.vrt import VRT
