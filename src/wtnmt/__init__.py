"""wtnmt: the Weighted Transformer (Ahmed, Keskar & Socher, 2017) for machine translation.

``from wtnmt import Translator, Sampling`` gives the Python API; importing ``wtnmt`` alone
stays light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Sampling", "Translator", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from wtnmt.decode.translator import Translator

        return Translator
    if name == "Sampling":
        from wtnmt.decode.sampling import Sampling

        return Sampling
    raise AttributeError(f"module 'wtnmt' has no attribute {name!r}")
