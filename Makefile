# The two commands: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTEST_ARGS ?=
# `make test` runs the suite in two tiers (docs/testing.md). First every test not marked `chaos`, on
# PYTEST_WORKERS pytest-xdist workers, one top-level test folder per worker at a time (tests/conftest.py).
# Then the chaos tier (network cuts, kill -9 of ackers, killed drivers, compose node loss) serially and
# alone: a kill test of replicated ackers once starved of CPU beside Spark on a worker and failed.
# PYTEST_WORKERS= (empty) runs the first tier serially too; PYTEST_ARGS go to both tiers.
PYTEST_WORKERS ?= -n 2 --dist loadscope

# System packages the tests use for real components: a Prometheus server and
# promtool (metrics test), docker-compose (validates deploy/docker-compose.yml,
# runs the compose suite), Java 17 (PySpark), debootstrap (the local Debian base
# image, see deploy/images/build.sh), redis-server and rabbitmq-server (the queue sources' tests
# start brokers of their own).
SYSTEM_BINARIES := prometheus promtool docker-compose java debootstrap redis-server rabbitmq-server

.PHONY: fuzz-native demo test lint bench venv system-deps images test-images proto clean help native-test

help:
	@echo "make demo   run the word-count job with tracking, failures and replays (local ackers, local Spark)"
	@echo "make test   set up .venv and system packages, lint, then run the test suite"
	@echo "make lint   ruff check, ruff format --check and mypy (generated code excluded)"
	@echo "make bench  run acker-bench against an embedded cluster"
	@echo "make images build the acker and Spark images (and a local Prometheus) without a registry"
	@echo "make proto  regenerate proto/acker_protocol/v1 from its .proto"
	@echo "make native-test  cargo test and cargo clippy on the native ledger crate"
	@echo "make fuzz-native  fuzz the native ApplyRequest decoder for FUZZ_SECONDS (default 60)"

# The native ledger's sources: the venv (its editable install holds the built
# extension) is rebuilt when they change.
NATIVE     := acker_service/native
RUST_SRCS  := $(NATIVE)/Cargo.toml $(NATIVE)/Cargo.lock $(wildcard $(NATIVE)/src/*.rs)
# pyo3's build script must see the venv's interpreter, whatever python3 is on PATH.
CARGO      := cd $(NATIVE) && PYO3_PYTHON=$(abspath $(PY)) cargo

$(VENV)/.installed: pyproject.toml $(RUST_SRCS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# What the demo needs and no more: the [tools] extra (server, Spark, rich), not the
# test and lint toolchain; pip's own progress is shown (pyspark alone is ~300 MB).
# A venv with the full dev install already has it all.
$(VENV)/.demo-installed: pyproject.toml $(RUST_SRCS)
	@echo "make demo: installing pyspark-acker[tools] into $(VENV) (pyspark is a large download; the native ledger compiles with cargo)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[tools]'
	touch $@

DEMO_VENV := $(if $(wildcard $(VENV)/.installed),$(VENV)/.installed,$(VENV)/.demo-installed)

system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages for:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus docker-compose openjdk-17-jre-headless debootstrap redis-server rabbitmq-server >/dev/null; \
	fi
	@# Debian starts the packaged Prometheus as a service; the tests run their own.
	@command -v systemctl >/dev/null 2>&1 && systemctl stop prometheus >/dev/null 2>&1 || true
	@# The same for the brokers: the queue tests start redis-server and rabbitmq-server nodes of their own.
	@for s in redis-server rabbitmq-server; do \
	  (command -v systemctl >/dev/null 2>&1 && systemctl stop $$s >/dev/null 2>&1) || service $$s stop >/dev/null 2>&1 || true; \
	done

DEMO_ARGS ?= --spark-read

demo: $(DEMO_VENV)
	$(VENV)/bin/acker-demo $(DEMO_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Both tiers always run; make test fails when either fails (pytest's exit 5, no test selected, counts as a
# failure unless PYTEST_ARGS narrow the run). Each tier ends with pytest's own closing line; the last line
# repeats both. --durations: each tier's slowest tests, to keep `make test` within its 10-minute budget.
# When test-images just built the images, the packed-venv and wheel-install tests reuse the project wheel that build.sh
# made from this tree a moment before (ACKER_TEST_WHEEL) instead of building the same wheel again.
test: $(VENV)/.installed system-deps lint native-test test-images
	@logs=$$(mktemp -d); \
	wheel=$${ACKER_TEST_WHEEL:-$$(docker info >/dev/null 2>&1 && ls $(CURDIR)/build/docker/wheels/pyspark_acker-*.whl 2>/dev/null | head -n 1)}; \
	export ACKER_TEST_WHEEL=$$wheel; \
	{ $(PY) -m pytest -m "not chaos" --durations=30 $(PYTEST_WORKERS) $(PYTEST_ARGS); echo $$? >$$logs/rest.rc; } | tee $$logs/rest.out; \
	{ $(PY) -m pytest -m chaos --durations=30 $(PYTEST_ARGS); echo $$? >$$logs/chaos.rc; } | tee $$logs/chaos.out; \
	rest=$$(cat $$logs/rest.rc); chaos=$$(cat $$logs/chaos.rc); \
	if [ -n "$(strip $(PYTEST_ARGS))" ]; then [ "$$rest" = 5 ] && rest=0; [ "$$chaos" = 5 ] && chaos=0; fi; \
	echo "make test: not chaos (exit $$rest): $$(tail -n 1 $$logs/rest.out | tr -d '=' | sed 's/^ *//')"; \
	echo "make test: chaos, serial (exit $$chaos): $$(tail -n 1 $$logs/chaos.out | tr -d '=' | sed 's/^ *//')"; \
	rm -rf $$logs; [ "$$rest" = 0 ] && [ "$$chaos" = 0 ]

# Debian base (debootstrap, only when missing), wheels built on the host, then the
# acker image, the Spark image (Java from Debian, the venv's pyspark) and a Prometheus
# image from Debian's package; no registry needed.
images: $(VENV)/.installed system-deps
	PYTHON=$(abspath $(PY)) deploy/images/build.sh all

# The compose suite needs the images; without a Docker engine it is skipped.
test-images: $(VENV)/.installed system-deps
	@if docker info >/dev/null 2>&1; then \
	  PYTHON=$(abspath $(PY)) deploy/images/build.sh all; \
	else \
	  echo "no Docker engine answers 'docker info': the compose suite (tests/compose) will be skipped"; \
	fi

# The crate's own tests (the pure core, without libpython) and clippy on everything.
native-test: $(VENV)/.installed
	$(CARGO) test --no-default-features --quiet
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
	$(CARGO) clippy --all-targets --quiet -- -D warnings

# The decoder fuzz target (cargo fuzz, libFuzzer) for FUZZ_SECONDS; on demand, not in
# `make test`. cargo-fuzz builds with nightly flags: RUSTC_BOOTSTRAP lets the stable
# toolchain accept them.
FUZZ_SECONDS ?= 60
fuzz-native:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	export RUSTC_BOOTSTRAP=1; $(CARGO) fuzz run apply_request -- -max_total_time=$(FUZZ_SECONDS)

bench: $(VENV)/.installed
	$(VENV)/bin/acker-bench $(BENCH_ARGS)

proto: $(VENV)/.installed
	$(PY) scripts/generate_proto.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info $(NATIVE)/target acker_service/_native*.so
