# The project's entry points. `make demo` and `make test` set everything up on a fresh machine:
# a virtual environment at .venv with the project and all its dependencies (see pyproject.toml).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# checkov (security scan of the chart and manifests) pins packaging<24, networkx<3 and
# python-dateutil<3, which conflict with torch's and the kubernetes client's needs: it gets a
# virtual environment of its own inside .venv.
CHECKOV_VENV := $(VENV)/tools-checkov
CHECKOV      := $(CHECKOV_VENV)/bin/checkov

.PHONY: setup control-plane demo test lint typecheck unit crds clean

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
$(HELM): scripts/install-helm.sh | $(STAMP)
	scripts/install-helm.sh $(HELM)

# The real Kubernetes control plane the local cluster runs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl), built once from the Go modules pinned in
# localcluster/controlplane/ into ~/.cache/rtj (see the script; KUBEBUILDER_ASSETS skips the build).
# kubectl of that version is linked into .venv/bin.
control-plane: | $(STAMP)
	dir=$$(scripts/build-control-plane.sh) && ln -sf "$$dir/kubectl" $(BIN)/kubectl

setup: $(STAMP) $(CHECKOV) $(HELM) control-plane

demo: $(STAMP) control-plane
	$(BIN)/rtj demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) $(CHECKOV) $(HELM) control-plane lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# Regenerate crds/, docs/api.md and the chart's CRD copy from the pydantic models.
crds: $(STAMP)
	$(BIN)/rtj crd --write
	scripts/sync-chart-crds.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
