VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: install
	$(PYTHON) -m recipes.ppo --output-dir runs/demo --overwrite --logger wandb

test: install
	$(PYTHON) -m pytest -n 2 --dist loadgroup -q

bench: install
	$(PYTHON) -m pip install --quiet -e ".[test,bench]"
	$(PYTHON) -m benchmarks.ppo_vs_sb3
	$(PYTHON) -m benchmarks.dqn_vs_sb3
	$(PYTHON) -m benchmarks.sac_vs_sb3
	$(PYTHON) -m benchmarks.td3_vs_sb3
	$(PYTHON) -m benchmarks.ppo_hopper_vs_sb3 --sides sb3 ours-zoo
	$(PYTHON) -m benchmarks.sac_halfcheetah_vs_sb3 --sides sb3 ours-zoo
	$(PYTHON) -m benchmarks.td3_halfcheetah_vs_sb3 --sides sb3 ours-zoo
	$(PYTHON) -m benchmarks.atari_vs_sb3 --algo ppo
	$(PYTHON) -m benchmarks.atari_vs_sb3 --algo dqn

clean:
	rm -rf runs $(VENV)
