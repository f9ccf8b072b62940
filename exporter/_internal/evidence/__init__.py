"""What the cause decision reads and weighs, below the stages that use it: the signals (their
PromQL, `signals`) and the causes with the decision's thresholds (`thresholds`). `diagnose/`
decides with them; `generate/` tells on-call the same numbers in rules and panels; neither
imports the other.
"""
