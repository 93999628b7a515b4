#!/bin/bash
# Replace the broken Makefile with a complete one and exercise every target.
set -euo pipefail
cd /app/project
cat > Makefile <<'MK'
# Build file for the stats tool.
CC      := gcc
CFLAGS  := -Wall -Wextra -std=c11 -O2
CPPFLAGS := -Isrc -MMD -MP
LDLIBS  := -lm
PREFIX  ?= /usr/local

SRCS     := $(wildcard src/*.c)
OBJS     := $(patsubst src/%.c,build/%.o,$(SRCS))
LIB_OBJS := $(filter-out build/main.o,$(OBJS))
DEPS     := $(OBJS:.o=.d) build/test_stats.d

.PHONY: all test clean install

all: bin/app

bin/app: $(OBJS) | bin
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

build/%.o: src/%.c | build
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

build/test_stats.o: tests/test_stats.c | build
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

bin/test_stats: build/test_stats.o $(LIB_OBJS) | bin
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: bin/test_stats
	./bin/test_stats

install: bin/app
	install -d "$(PREFIX)/bin"
	install -m 755 bin/app "$(PREFIX)/bin/app"

bin build:
	mkdir -p $@

clean:
	rm -rf bin build

-include $(DEPS)
MK
# sanity checks
make clean >/dev/null
make -j8
./bin/app 3 4 5
make -q all && echo "up to date"
make -j8 test
make install PREFIX=/tmp/stage && /tmp/stage/bin/app --version && rm -rf /tmp/stage
make clean
