// A local MCP server with Malloy Publisher's tool names, argument schemas and result envelope,
// over the real Malloy compiler on DuckDB: pytest-evalloop's `malloy` target.
//
// One process serves one package directory (one DuckDB connection per package: a second one
// with the same sandboxed settings fails, "the configuration has been locked"). Ad-hoc queries
// compile in restricted mode (`loadRestrictedQuery`, the library's API for untrusted text,
// which Publisher's MCP uses too). Nothing here re-implements Malloy: compiling, running and
// the model's entities all come from @malloydata/malloy.
//
//   node server.mjs --root <package dir> [--package-name N] [--environment local]
//                   [--row-limit 1000] [--check]
//
// --check compiles every model of the package, prints one JSON line (problems with file and
// line, the pins, the table files the models name) and exits 0 when all compiled, 1 when not;
// without it the server speaks MCP over stdio.

import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { Malloy, Runtime } from "@malloydata/malloy";
import { DuckDBConnection } from "@malloydata/db-duckdb";
import lunr from "lunr";
import { z } from "zod";

const require = createRequire(import.meta.url);
const COMPILER_VERSION = require("@malloydata/malloy/package.json").version;
// Compiled queries kept per model (most recently used): a set's distinct model queries and
// an answerer's retries fit; an answerer that sends thousands of distinct texts evicts the
// oldest instead of growing the server.
const PREPARED_PER_MODEL = 512;
const DEFAULT_ROW_LIMIT = 1000;
const MAX_RESULT_CHARS = 90_000;
const NEITHER_QUERY = "Either 'query' or both 'sourceName' and 'queryName' must be provided";
const BOTH_QUERIES = "Cannot provide both 'query' and 'queryName'";
const TABLE_REF = /duckdb\s*\.\s*table\s*\(\s*(['"])(.*?)\1\s*\)/g;
const SKIPPED_DIRS = new Set(["node_modules", "data", ".git"]);

function parseArgs(argv) {
  const out = { environment: "local", rowLimit: DEFAULT_ROW_LIMIT, check: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) fail(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === "--root") out.root = next();
    else if (arg === "--package-name") out.packageName = next();
    else if (arg === "--environment") out.environment = next();
    else if (arg === "--row-limit") out.rowLimit = Number(next());
    else if (arg === "--check") out.check = true;
    else fail(`unknown argument ${arg}`);
  }
  if (!out.root) fail("--root <package dir> is required");
  return out;
}

function fail(message) {
  process.stderr.write(`evalloop malloy server: ${message}\n`);
  process.exit(2);
}

// ---- the package on disk -------------------------------------------------------------------

function modelFiles(root, dir = root) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.name.startsWith(".") || SKIPPED_DIRS.has(entry.name)) continue;
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...modelFiles(root, full));
    else if (entry.name.endsWith(".malloy")) found.push(path.relative(root, full));
  }
  return found.sort();
}

function packageName(root, given) {
  if (given) return given;
  try {
    const meta = JSON.parse(fs.readFileSync(path.join(root, "publisher.json"), "utf8"));
    if (typeof meta.name === "string" && meta.name) return meta.name;
  } catch {
    // no publisher.json: the folder's name, as Publisher's own listing falls back to
  }
  return path.basename(root);
}

function lineOf(text, index) {
  return text.slice(0, index).split("\n").length;
}

// Every `duckdb.table('x')` of every model must name a file that exists: a missing one crashes
// the compiler with "Unknown Dialect ~malformed~" and no diagnostics, so say which it is first.
function tableProblems(root, files) {
  const problems = [];
  const dirs = new Set();
  const found = new Set();
  for (const file of files) {
    const text = fs.readFileSync(path.join(root, file), "utf8");
    for (const match of text.matchAll(TABLE_REF)) {
      const ref = match[2];
      const full = path.resolve(root, ref);
      if (!fs.existsSync(full)) {
        problems.push({
          file,
          line: lineOf(text, match.index),
          message: `table file ${ref} does not exist (looked for ${full})`,
          code: "missing-table-file",
        });
      } else {
        found.add(full);
        // A symlinked data folder resolves elsewhere: its real place must be allowed too.
        dirs.add(path.dirname(fs.realpathSync(full)));
      }
    }
  }
  return { problems, dirs: [...dirs], files: [...found].sort() };
}

function contentSha(root, files) {
  const hash = crypto.createHash("sha256");
  const extra = ["publisher.json"].filter((f) => fs.existsSync(path.join(root, f)));
  for (const file of [...files, ...extra].sort()) {
    hash.update(file);
    hash.update("\0");
    hash.update(fs.readFileSync(path.join(root, file)));
    hash.update("\0");
  }
  return hash.digest("hex");
}

// ---- the compiler --------------------------------------------------------------------------

function problemsOf(error, root) {
  const problems = error && Array.isArray(error.problems) ? error.problems : [];
  if (!problems.length) {
    return [{ message: String(error && error.message ? error.message : error), code: "error" }];
  }
  return problems
    .filter((p) => p.severity !== "warn" && p.severity !== "debug")
    .map((p) => {
      const out = { message: p.message, code: p.code };
      if (p.errorTag) out.errorTag = p.errorTag;
      const at = p.at;
      if (at && at.url) {
        out.file = at.url.startsWith("file:")
          ? path.relative(root, fileURLToPath(at.url)) || at.url
          : at.url;
        out.line = at.range.start.line + 1;
        out.character = at.range.start.character + 1;
      }
      return out;
    });
}

function describeProblems(problems) {
  return problems
    .map((p) => {
      if (!p.line) return p.message;
      // The answerer's text compiles as an internal URL: call it what it is, "query".
      const where = String(p.file).startsWith("internal://") ? "query" : p.file;
      return `${where}:${p.line}:${p.character}: ${p.message}`;
    })
    .join("\n");
}

class Package {
  constructor(options) {
    this.root = fs.realpathSync(path.resolve(options.root));
    this.environment = options.environment;
    this.name = packageName(this.root, options.packageName);
    this.rowLimit = options.rowLimit;
    this.files = modelFiles(this.root);
    this.models = new Map();
    this.loadErrors = [];
  }

  pins() {
    return {
      contentSha: contentSha(this.root, this.files),
      compiler: `@malloydata/malloy ${COMPILER_VERSION}`,
      compilerVersion: COMPILER_VERSION,
      package: this.name,
      models: this.files,
    };
  }

  async load() {
    this.contentSha = contentSha(this.root, this.files);
    const tables = tableProblems(this.root, this.files);
    this.loadErrors = [...tables.problems];
    this.tableFiles = tables.files;
    // Relative table paths resolve against the working directory.
    process.chdir(this.root);
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), "evalloop-malloy-"));
    const allowed = [...new Set([this.root, ...tables.dirs, this.tmp])];
    this.connection = new DuckDBConnection({
      name: "duckdb",
      workingDirectory: this.root,
      // Sandboxed: no extension downloads, no files outside the package and its data.
      securityPolicy: "sandboxed",
      allowedDirectories: allowed,
      tempDirectory: this.tmp,
    });
    const root = this.root;
    const urlReader = {
      readURL: async (url) => {
        const file = fileURLToPath(url);
        if (file !== root && !file.startsWith(root + path.sep)) {
          throw new Error(`${url} is outside the package`);
        }
        return fs.promises.readFile(file, "utf8");
      },
    };
    this.runtime = new Runtime({ urlReader, connection: this.connection });
    if (tables.problems.length) return;
    for (const file of this.files) {
      const materializer = this.runtime.loadModel(pathToFileURL(path.join(this.root, file)));
      try {
        const model = await materializer.getModel();
        this.models.set(file, { materializer, model, entities: null });
      } catch (error) {
        this.loadErrors.push(...problemsOf(error, this.root).map((p) => ({ file, ...p })));
      }
    }
  }

  close() {
    if (this.tmp) fs.rmSync(this.tmp, { recursive: true, force: true });
  }

  entities(modelPath) {
    const loaded = this.models.get(modelPath);
    if (!loaded) return [];
    if (loaded.entities) return loaded.entities;
    const base = { environmentName: this.environment, packageName: this.name, modelPath };
    const out = [];
    for (const explore of loaded.model.explores) {
      out.push({ kind: "source", name: explore.name, source: explore.name, ...base, doc: docOf(explore) });
      for (const field of explore.allFields) {
        if (field.isExploreField()) continue; // joins are not entities (Publisher skips them)
        let kind;
        if (field.isQueryField()) kind = "view";
        // An aggregate field is a calculation in the compiled model: a measure.
        else if (field.isAtomicField()) kind = field.isCalculation() ? "measure" : "dimension";
        else continue;
        out.push({ kind, name: field.name, source: explore.name, ...base, doc: docOf(field) });
      }
    }
    for (const query of loaded.model.namedQueries || []) {
      out.push({ kind: "query", name: query.name, source: query.sourceName || "", ...base, doc: "" });
    }
    loaded.entities = out;
    loaded.index = lunr(function () {
      this.ref("i");
      this.field("name", { boost: 4 });
      this.field("source");
      this.field("doc");
      // Identifiers like total_sales_2022 are searched by their words too.
      this.tokenizer.separator = /[\s\-_.]+/;
      out.forEach((entity, i) => this.add({ i: String(i), name: entity.name, source: entity.source, doc: entity.doc }));
    });
    return out;
  }

  search(modelPath, query, limit) {
    const entities = this.entities(modelPath);
    const loaded = this.models.get(modelPath);
    const text = query.replace(/[~^:*+\-"]/g, " ").trim();
    if (!text || !loaded) return [];
    let hits;
    try {
      hits = loaded.index.search(text);
    } catch {
      hits = [];
    }
    return hits.slice(0, limit).map((hit) => entities[Number(hit.ref)]);
  }

  async run(modelPath, text) {
    // What QueryMaterializer.run does, with the compile kept: an answerer runs the same text
    // more than once (and the conductor re-executes its final query), and compiling is most
    // of a small query's time. Only the compile is reused; every call runs the SQL afresh.
    const options = { rowLimit: this.rowLimit };
    const preparedResult = await this.prepared(modelPath, text, options);
    return Malloy.run({ connections: this.runtime.connections, preparedResult, options });
  }

  async prepared(modelPath, text, options) {
    // Per loaded model (a server loads each model once, so once per model version); a failed
    // compile is not kept, so its error is the compiler's every time.
    const loaded = this.models.get(modelPath);
    loaded.prepared ??= new Map();
    const cached = loaded.prepared.get(text);
    if (cached) {
      loaded.prepared.delete(text); // most recently used last: the first key is the oldest
      loaded.prepared.set(text, cached);
      return cached;
    }
    const prepared = await loaded.materializer.loadRestrictedQuery(text).getPreparedResult(options);
    loaded.prepared.set(text, prepared);
    if (loaded.prepared.size > PREPARED_PER_MODEL) {
      loaded.prepared.delete(loaded.prepared.keys().next().value);
    }
    return prepared;
  }

  async compile(modelPath, text) {
    const loaded = this.models.get(modelPath);
    const prepared = await loaded.materializer.loadRestrictedQuery(text).getPreparedResult();
    return prepared;
  }
}

function docOf(entity) {
  try {
    const docs = entity.annotations.texts("doc");
    if (docs && docs.length) return docs.join("\n").replace(/^#\(doc\)\s?/gm, "").trim();
  } catch {
    // an entity with no annotations
  }
  return "";
}

// ---- Publisher's envelope ------------------------------------------------------------------

function uri(pkg, modelPath, fragment) {
  let out = `malloy://environment/${encodeURIComponent(pkg.environment)}/package/${encodeURIComponent(pkg.name)}`;
  if (modelPath) out += `/models/${encodeURIComponent(modelPath)}`;
  return `${out}#${fragment}`;
}

function jsonValue(_key, value) {
  if (typeof value === "bigint") {
    return value <= BigInt(Number.MAX_SAFE_INTEGER) && value >= -BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value)
      : value.toString();
  }
  return value;
}

function resource(resourceUri, payload, extraText) {
  const content = [
    { type: "resource", resource: { uri: resourceUri, mimeType: "application/json", text: JSON.stringify(payload, jsonValue, 2) } },
  ];
  if (extraText) content.push({ type: "text", text: extraText });
  return { content };
}

function toolError(resourceUri, message, suggestions, extra = {}) {
  const payload = { error: message, suggestions, ...extra };
  const text = `${message}\n\nSuggestions:\n${suggestions.map((s) => `- ${s}`).join("\n")}`;
  return { ...resource(resourceUri, payload, text), isError: true };
}

function protocolError(message) {
  return { isError: true, content: [{ type: "text", text: `MCP error -32602: ${message}` }] };
}

function checkPackage(pkg, tool, args) {
  if (args.environmentName !== pkg.environment || args.packageName !== pkg.name) {
    return toolError(
      `error://${tool}/modelAccess`,
      `Resource not found: package '${args.environmentName}/${args.packageName}' is not served here`,
      [`This server serves environment '${pkg.environment}', package '${pkg.name}'; call malloy_getContext to list it`],
    );
  }
  if (args.modelPath !== undefined && !pkg.models.has(args.modelPath)) {
    const loadError = pkg.loadErrors.find((e) => e.file === args.modelPath);
    if (loadError) {
      return toolError(`error://${tool}/modelAccess`, `Model '${args.modelPath}' failed to compile: ${describeProblems([loadError])}`, [
        "The model itself does not compile; its author must fix it",
      ]);
    }
    return toolError(`error://${tool}/modelAccess`, `Resource not found: model '${args.modelPath}' in package '${pkg.name}'`, [
      `Models of this package: ${pkg.files.join(", ")}`,
    ]);
  }
  return null;
}

function queryError(pkg, args, error) {
  const problems = problemsOf(error, pkg.root);
  const restricted = problems.some((p) => p.code === "restricted-construct-forbidden" || p.errorTag === "restricted-mode");
  const resourceName = `${pkg.environment}/${pkg.name}/${args.modelPath}`;
  const message = `Error during executeQuery for resource '${resourceName}'. ${describeProblems(problems)}`;
  const suggestions = restricted
    ? ["Queries run in restricted mode: use the model's sources, views, dimensions and measures instead of raw tables, SQL or imports"]
    : ["Check the query's syntax and the field names against malloy_getContext"];
  return toolError("error://executeQuery/queryExecution", message, suggestions, { problems });
}

function envelope(pkg, rows, schema) {
  const payload = {
    rows,
    _meta: { schema, annotations: [], connection_name: "duckdb" },
    _query_row_limit: pkg.rowLimit,
    _limit_source: "server_default",
    _limit_hit: rows.length >= pkg.rowLimit,
  };
  let text = JSON.stringify(payload, jsonValue, 2);
  if (text.length > MAX_RESULT_CHARS) {
    // Drop rows until the envelope fits, saying so (Publisher's 90k-character cap).
    let lo = 0;
    let hi = rows.length;
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      const trial = JSON.stringify({ ...payload, rows: rows.slice(0, mid) }, jsonValue, 2);
      if (trial.length <= MAX_RESULT_CHARS - 200) lo = mid;
      else hi = mid - 1;
    }
    Object.assign(payload, { rows: rows.slice(0, lo), _rows_truncated: true, _total_rows: rows.length, _returned_rows: lo });
  }
  return payload;
}

// ---- the MCP server ------------------------------------------------------------------------

function buildServer(pkg) {
  const server = new McpServer(
    { name: "malloy-publisher-mcp-server", version: "0.0.1" },
    { instructions: "Start with malloy_getContext to find the sources, views and fields of a package, then run Malloy with malloy_executeQuery." },
  );
  const modelArgs = {
    environmentName: z.string().describe("Environment name, from malloy_getContext"),
    packageName: z.string().describe("Package name, from malloy_getContext"),
    modelPath: z.string().describe("Path of the .malloy file inside the package"),
  };

  server.registerTool(
    "malloy_getContext",
    {
      description:
        "Discover what can be queried. Without environmentName: list environments. With environmentName: list its packages. " +
        "With a package and no query: list its sources. With a query: the sources, views, dimensions and measures that match it, best first.",
      inputSchema: {
        environmentName: z.string().optional(),
        packageName: z.string().optional(),
        query: z.string().max(500).optional().describe("Plain-English description of what you need"),
        sourceName: z.string().optional().describe("Only entities of this source"),
        limit: z.number().int().positive().max(50).optional(),
      },
    },
    async (args) => {
      if (!args.environmentName) {
        return resource("malloy://environment/home#get-context", {
          results: [{ kind: "environment", name: pkg.environment, packages: [pkg.name] }],
        });
      }
      if (args.environmentName !== pkg.environment) {
        return toolError("error://getContext/modelAccess", `Resource not found: environment '${args.environmentName}'`, [
          `Call malloy_getContext with no arguments to list environments`,
        ]);
      }
      if (!args.packageName) {
        const entry = { kind: "package", name: pkg.name, description: "", environmentName: pkg.environment };
        if (pkg.loadErrors.length) entry.error = describeProblems(pkg.loadErrors);
        return resource(uri(pkg, null, "get-context"), { results: [entry] });
      }
      const denied = checkPackage(pkg, "getContext", args);
      if (denied) return denied;
      let results;
      const query = (args.query || "").trim();
      if (!query) {
        results = pkg.files.flatMap((file) => pkg.entities(file).filter((e) => e.kind === "source"));
        if (args.limit) results = results.slice(0, args.limit);
      } else {
        const limit = args.limit || 10;
        const all = pkg.files.flatMap((file) => pkg.search(file, query, 50));
        results = all.filter((e) => !args.sourceName || e.source === args.sourceName).slice(0, limit);
      }
      if (args.sourceName && !query) results = results.filter((e) => e.source === args.sourceName);
      // Publisher's content hash over the package's model files: what a run pins as modelSha.
      return resource(uri(pkg, null, "get-context"), { results, sourceContentSha: pkg.contentSha });
    },
  );

  server.registerTool(
    "malloy_executeQuery",
    {
      description:
        "Run Malloy against a model and return its rows. Send `query` (ad-hoc Malloy, restricted mode: no raw SQL, imports or table() sources) " +
        "or `queryName` with `sourceName` (a named view). Up to 1000 rows.",
      inputSchema: {
        ...modelArgs,
        query: z.string().optional().describe("Ad-hoc Malloy, e.g. run: order_items -> { aggregate: total_sales }"),
        queryName: z.string().optional().describe("A view or named query (bare name)"),
        sourceName: z.string().optional().describe("The view's source, with queryName"),
        filterParams: z.record(z.union([z.string(), z.array(z.string())])).optional(),
        givens: z.record(z.unknown()).optional(),
      },
    },
    async (args) => {
      const hasQuery = typeof args.query === "string" && args.query.trim() !== "";
      if (hasQuery && args.queryName) return protocolError(BOTH_QUERIES);
      if (!hasQuery && !(args.queryName && (args.sourceName || true))) return protocolError(NEITHER_QUERY);
      const denied = checkPackage(pkg, "executeQuery", args);
      if (denied) return denied;
      const text = hasQuery
        ? args.query
        : args.sourceName
          ? `run: ${args.sourceName} -> ${args.queryName}`
          : `run: ${args.queryName}`;
      let result;
      try {
        result = await pkg.run(args.modelPath, text);
      } catch (error) {
        return queryError(pkg, args, error);
      }
      const rows = result.data.toObject();
      const payload = envelope(pkg, rows, result.resultExplore ? schemaOf(result.resultExplore) : {});
      return resource(uri(pkg, args.modelPath, "result"), payload);
    },
  );

  server.registerTool(
    "malloy_compile",
    {
      description: "Compile-check Malloy against a model without running it; returns diagnostics and, with includeSql, the SQL.",
      inputSchema: {
        ...modelArgs,
        source: z.string().optional().describe("Malloy to check (restricted mode), appended to the model"),
        includeSql: z.boolean().optional(),
      },
    },
    async (args) => {
      const denied = checkPackage(pkg, "compile", args);
      if (denied) return denied;
      if (!args.source) return resource(uri(pkg, args.modelPath, "compile"), { status: "success", diagnostics: [] });
      try {
        const prepared = await pkg.compile(args.modelPath, args.source);
        const payload = { status: "success", diagnostics: [] };
        if (args.includeSql) payload.sql = prepared.sql;
        return resource(uri(pkg, args.modelPath, "compile"), payload);
      } catch (error) {
        const diagnostics = problemsOf(error, pkg.root).map((p) => ({
          severity: "error",
          message: p.message,
          code: p.code,
          model: args.modelPath,
          line: p.line ? p.line - 1 : 0,
          character: p.character ? p.character - 1 : 0,
        }));
        return { ...resource(uri(pkg, args.modelPath, "compile"), { status: "error", diagnostics }), isError: true };
      }
    },
  );

  server.registerTool(
    "malloy_getStatus",
    { description: "Health of this server: whether it serves, and any package load errors.", inputSchema: {} },
    async () => {
      const payload = {
        operationalState: "serving",
        initialized: true,
        environments: [{ name: pkg.environment, packages: [pkg.name] }],
        // Not Publisher's: what the harness pins a run to (content sha, compiler version).
        evalloop: pkg.pins(),
      };
      if (pkg.loadErrors.length) {
        payload.loadErrors = pkg.loadErrors.map((e) => ({ environment: pkg.environment, package: pkg.name, message: describeProblems([e]) }));
      }
      return resource("malloy://environment/home#status", payload);
    },
  );
  return server;
}

function schemaOf(explore) {
  return {
    fields: explore.allFields.map((f) => ({ name: f.name, kind: f.isAtomicField() ? "dimension" : "join", type: f.isAtomicField() ? f.type : "nest" })),
  };
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  if (!fs.existsSync(options.root) || !fs.statSync(options.root).isDirectory()) {
    fail(`--root ${options.root} is not a directory`);
  }
  const pkg = new Package(options);
  if (!pkg.files.length) fail(`no .malloy model file under ${pkg.root}`);
  await pkg.load();
  if (options.check) {
    const ok = pkg.loadErrors.length === 0;
    process.stdout.write(JSON.stringify({ ok, problems: pkg.loadErrors, pins: pkg.pins(), root: pkg.root, tables: pkg.tableFiles }) + "\n");
    pkg.close();
    process.exit(ok ? 0 : 1);
  }
  const server = buildServer(pkg);
  const transport = new StdioServerTransport();
  process.stdin.on("end", () => {
    pkg.close();
    process.exit(0);
  });
  await server.connect(transport);
}

main().catch((error) => {
  process.stderr.write(`evalloop malloy server: ${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
