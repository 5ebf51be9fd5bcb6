"""The ``goodput`` command line (``goodput.cli``): serve the control plane, migrate the
database, mint API keys, apply and list SLOs. Run it as ``goodput ...`` or ``python -m goodput``."""
