# qkv: two commands get you going on a fresh Debian 12 machine (as root):
#   make demo   installs what is missing, builds, runs the built-in example
#   make test   installs what is missing, builds, runs every test
# Build trees: build/ (release, the CLI at build/qkv), build/asan, build/tsan, build/portable.

JOBS ?= $(shell nproc)
PYTHON ?= /usr/bin/python3
ORACLE ?= ../shared/oracle

.PHONY: all deps build demo test test-unit test-oracle test-asan test-tsan portable install clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake --preset $(if $(CI),ci,release) >/dev/null
	@cmake --build build -j $(JOBS)

demo: build
	./build/qkv explain --html qkv-explain.html

# Every test: the unit and CLI suites, the PyTorch oracle (when ../shared/oracle is there),
# then the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: test-unit test-oracle test-asan

test-unit: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-oracle: build
	@if [ -d $(ORACLE) ]; then $(PYTHON) $(ORACLE)/check.py build/qkv; \
	else echo "oracle: $(ORACLE) not found, skipped"; fi

test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build build/asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build build/tsan -j $(JOBS)
	ctest --preset tsan -L threads -j $(JOBS)

portable: deps
	@cmake --preset portable >/dev/null
	@cmake --build build/portable -j $(JOBS)
	ctest --test-dir build/portable --output-on-failure -j $(JOBS)

install: build
	cmake --install build

clean:
	rm -rf build
