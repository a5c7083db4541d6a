"""Load for a serving endpoint and how it fared against the SLO: a model's requests from a trace
slice or a Poisson stand-in (:mod:`.workload`), their open-loop replay over HTTP measuring TTFT
and TPOT (:mod:`.replay`), and the same requests served by the sim engine's scheduler in virtual
time (:mod:`.virtual`). The e2e SLO test and the benches (``bench/slo.py``,
``bench/disagg_real.py``) drive a gateway with them."""
