"""How much work a GPU does under a power cap: the simulator's stated model.

``throughput = (P / demand) ** ALPHA`` for ``P <= demand``: ``demand`` is what the
job would draw unhindered, ``P`` what the GPU draws (held by the cap, or by thermal
slowdown). A cap above the demand costs nothing; a binding one costs less than in
proportion, because the power management unit drops clocks and voltage together
(dynamic power ~ C V^2 f) and a training step is partly memory- and
communication-bound, which lower clocks slow less.

Where ALPHA comes from (no source gives it as a fitted exponent; these bound it):

* McDonald et al., "Great Power, Great Responsibility: Recommendations for Reducing
  Energy for Training Language Models", Findings of NAACL 2022 (arXiv:2205.09646),
  MIT Lincoln Laboratory: capping V100s from 250 W to 150 W cut the energy of
  training large language models by 13.7 % on average with a "marginal" increase
  in time. With E = P t: if the uncapped jobs drew about 200 W, the time ratio is
  0.863 * 200/150 = 1.15 and ALPHA = ln(1/1.15) / ln(150/200) = 0.49; at 180 W,
  ALPHA = 0.26.
* Zhao et al., "Sustainable Supercomputing for AI: GPU Power Capping at HPC Scale"
  (arXiv:2402.18593), the same centre, find lower temperature and draw "with
  minimal impact on job performance" at its production caps (60-80 % of the limit).
* An operator's note (factryze.ai, "Power Capping", not peer reviewed): an H100
  capped from 700 W to 600 W loses 5-8 % throughput on memory-bound LLM inference
  (ALPHA 0.33-0.54) and 10-15 % on compute-bound pretraining (ALPHA 0.6-1.05).

ALPHA = 0.4 sits in the range for memory-bound training near the top of the power
curve. Far below it (a GPU at its minimum limit) clocks hit their floor and the
loss grows faster than this; the simulator uses the one exponent throughout, so
capacity given up under a deep cap is, if anything, understated.
"""

from __future__ import annotations

ALPHA = 0.4


def throughput_fraction(power_w: float, demand_w: float, alpha: float = ALPHA) -> float:
    """The fraction of its unhindered work rate a GPU delivers drawing power_w of demand_w."""
    if demand_w <= 0.0:
        return 1.0
    return float(min(1.0, max(0.0, power_w) / demand_w) ** alpha)
