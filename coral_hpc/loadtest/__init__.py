"""Load for a serving endpoint and how it fared against the SLO, driven from outside the daemon:

- :mod:`.workload`: a model's requests from a slice of the Azure trace, or a Poisson stand-in;
- :mod:`.replay`: their open-loop replay over HTTP, measuring TTFT and TPOT per request;
- :mod:`.virtual`: the same requests served by the sim engine's scheduler in virtual time;
- :mod:`.phases`: load phases against a real engine judged as ``coral-hpc profile`` judges them;
- :mod:`.host`: what this host's CPU and other processes did meanwhile.

The e2e SLO test, the real-engine serve test and the benches (``bench/slo.py``,
``bench/slo_vllm.py``, ``bench/disagg_real.py``) use them."""
