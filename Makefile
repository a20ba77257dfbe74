# migration-apiserver. `make run` starts the server on the embedded store; `make test` runs every test.
CARGO ?= cargo
PORT ?= 8443
DATA_DIR ?= ./data
CERT_DIR ?= ./certs
BIN := target/release/migration-apiserver

.PHONY: build run test deps bench certs lint fmt clean

build:
	$(CARGO) build --release --bin migration-apiserver

run: build
	$(BIN) serve --secure-port $(PORT) --data-dir $(DATA_DIR) --cert-dir $(CERT_DIR)

# Installs what the tests need when it is missing (kubectl), then runs unit and integration tests.
deps:
	bash scripts/install-test-deps.sh

test: deps
	$(CARGO) build --bin migration-apiserver
	$(CARGO) test --all-targets --no-fail-fast

bench:
	$(CARGO) build --release --bins
	./target/release/bench --server $(BIN)

certs: build
	$(BIN) certs --cert-dir $(CERT_DIR)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf $(DATA_DIR) target
