from ._weft import *
from ._weft import __all__ as __all__
from ._weft import __version__ as __version__
