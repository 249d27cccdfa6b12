"""The one prepared GPU run: every section of what only a GPU shows, planned before it runs, each case's row
written to DIR/gpu.jsonl as it ends. Without CUDA the same code runs at smoke size on the CPU.

    python -m benchmarks.gpu --out DIR                     # one GPU: under 8 minutes by the printed plan
    python -m benchmarks.gpu --out DIR --sections replay   # one section
    python -m benchmarks.gpu --plan-only                   # the plan alone
"""
