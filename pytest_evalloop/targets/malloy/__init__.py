"""The `malloy` target: a Malloy package served by the real compiler behind Publisher's MCP tools.

`server.mjs` (one Node file, its npm tree pinned by `package-lock.json`) is an MCP server with
Publisher's tool names, schemas and envelope over `@malloydata/malloy` on DuckDB; `install.py`
installs its tree once into a cache directory; `setpackages.py` reads which packages a set
names (the answerer's, the truth package) and finds them; `package.py` checks a package and
starts its server; `truth.py` runs golden queries on a set's truth package through a second
server; `gen_data.py` generates the malloy-samples ecommerce tables (`evalloop malloy-data`).
Layer: targets (may import sets and below, never answer or goldens). See docs/malloy.md.
"""
