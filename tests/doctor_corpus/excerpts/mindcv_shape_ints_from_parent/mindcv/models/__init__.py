from .edgenext import *
from .xcit import *
