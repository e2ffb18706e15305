"""corral: a control plane for sandbox fleets."""

__version__ = "0.1.0"
