"""privdl: differentially private decentralized and federated learning."""

from privdl.errors import PrivdlError

__version__ = "0.1.0"
__all__ = ["PrivdlError", "__version__"]
