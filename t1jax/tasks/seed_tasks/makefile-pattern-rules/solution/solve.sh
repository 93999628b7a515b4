#!/bin/bash
# Pattern rule for pages, an explicit rule for the index, order-only dependency on out/.
set -euo pipefail
cd /app/site
cat > Makefile <<'MK'
SOURCES := $(wildcard data/*.md)
PAGES := $(patsubst data/%.md,out/%.html,$(SOURCES))
TEMPLATE := templates/page.html

.PHONY: all clean

all: $(PAGES) out/index.html

out/%.html: data/%.md $(TEMPLATE) tools/md2html.py | out
	python3 tools/md2html.py $< $@ --template $(TEMPLATE)

out/index.html: $(PAGES) tools/mkindex.py | out
	python3 tools/mkindex.py $@ $(PAGES)

out:
	mkdir -p out

clean:
	rm -rf out
MK
make clean
make -j4
make
ls -l out
