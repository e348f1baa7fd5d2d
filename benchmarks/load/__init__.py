"""Load benchmark (issue 4): throughput, freshness and recall latency at 10k-1M memories.

``make bench-load SIZE=N`` builds a seeded synthetic corpus (``corpus.py``),
starts the service on the embedded stack and measures, in one run
(``run.py``): bulk write throughput beside a raw Typesense import of the same
documents, ack -> visible freshness per source at steady write rates, recall
latency per source and fused at 1/8/32 clients, direct pgvector and
Typesense baselines, the CPU each process spends per recall, and HNSW
recall per tier (``hnsw.py``). ``report.py`` writes
``benchmarks/results/load-<size>.{md,json,png}``; ``growth.py`` puts every
size measured so far side by side (``load-growth.{md,png}``, log-log).
Recalls are driven by ``client.py``'s lean keep-alive client. Before the
raw baselines Postgres is settled (``run.settle``), and after the load's
drain, before the recall rows and before the direct baselines the run waits
for an idle stack (``run.quiet``), reporting what the processes spent
meanwhile, so no metered row is charged for what an earlier phase left
running.
"""

__all__: list[str] = []
