#!/usr/bin/python3
"""The lists docs/ keeps by hand, checked against the code they describe.

    docs_lists_test.py SOURCE_DIR CHECK      one check (ctest runs each as its own entry)
    docs_lists_test.py SOURCE_DIR            every check

Each check reads the docs and the sources (nothing is built or run) and fails,
naming what differs and where to fix it, when a list in the docs and the code
disagree:

  metrics      the /metrics tables (agent: docs/using.md, daemon: docs/operating.md)
               against the metric families the code writes
  environment  what every worker gets (docs/using.md) and what the worker library
               reads (docs/worker-library.md) against the environment contract and
               the variables the code reads
  fuzz         the fuzz targets of docs/contributing.md against scripts/fuzz's
  labels       the ctest labels docs/contributing.md names against those the CMake
               files give, and the other way round
  features     docs/contributing.md's "Feature labels" table against the patterns of
               tests/CMakeLists.txt and the files it names
  only         the docs' "the only ..." sentences that name files
  citations    no file outside the repository is cited (DESIGN.md, /work/...), and
               every relative link in README.md and docs/ leads to a file
  layout       docs/design.md's folder table against the folders of the build and scripts/
  support      docs/contributing.md's table of tests/support against its headers
  options      the CMake options docs/contributing.md names against CMakeLists.txt, cmake/
  phases       docs/contributing.md's phases of scripts/test against the script's
  demo_flags   docs/worker-library.md's table of the demo's flags against its flags.cc
"""
import os
import re
import sys

# Where the environment contract lives: the header whose string constants are the
# names the agent writes into a worker's environment and the worker library reads.
ENV_CONTRACT = "worker_contract/include/ddp/worker_contract/env_names.h"

# Production code: where metric families are written and variables are read.
PRODUCTION_DIRS = ["common", "store", "store_server", "store_etcd", "rendezvous", "agent",
                   "launcher", "status_http", "worker_lib"]

failures = []


def fail(message):
    failures.append(message)


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def sources(root, folders, exts=(".cc", ".h")):
    """(relative path, text) of every source file under `folders`."""
    for folder in folders:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if name.endswith(exts):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        yield os.path.relpath(path, root), f.read()


def section(text, heading):
    """The lines of a markdown section, from its heading to the next of its level or above."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+) (.*)", line)
        if m and m.group(2).strip() == heading:
            level = len(m.group(1))
            out = []
            for rest in lines[i + 1:]:
                m2 = re.match(r"(#+) ", rest)
                if m2 and len(m2.group(1)) <= level:
                    break
                out.append(rest)
            return out
    fail(f"no section '{heading}' in the docs (the check looks for it by its heading)")
    return []


def table_after(lines, header_start):
    """The rows (lists of cells) of the first table whose header row starts with `header_start`."""
    rows = []
    inside = False
    for line in lines:
        if not inside:
            if line.startswith(header_start):
                inside = True
            continue
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= set("- "):
            continue  # the separator row
        rows.append(cells)
    if not inside:
        fail(f"no table with the header '{header_start}...'")
    return rows


def ticked(text):
    return re.findall(r"`([^`]+)`", text)


def compare(what, documented, actual, where_doc, where_code):
    for name in sorted(documented - actual):
        fail(f"{what}: {where_doc} lists '{name}', which {where_code} does not have")
    for name in sorted(actual - documented):
        fail(f"{what}: {where_code} has '{name}', which {where_doc} does not list")


# ---- metrics -------------------------------------------------------------------------

def metric_families(root, folders):
    """The metric family names written under `folders`: MetricsText::family("name", ...) and
    the process metrics' write_if_known(out, "name", ...)."""
    names = set()
    pattern = re.compile(r'\b(?:family|write_if_known)\(\s*(?:\w+,\s*)?"([a-z_:][a-z0-9_:]*)"')
    for _, text in sources(root, folders):
        names.update(pattern.findall(text))
    return names


def documented_metrics(rows):
    names = set()
    for row in rows:
        for name in ticked(row[0]):
            names.add(re.sub(r"\{.*\}$", "", name))
    return names


def check_metrics(root):
    process = metric_families(root, ["status_http"])
    if not process:
        fail("metrics: no process metric found under status_http/ (write_if_known(out, \"...\"))")
    agent = metric_families(root, ["agent"])
    agent_rows = table_after(read(root, "docs/using.md").splitlines(), "| metric | type | labels |")
    compare("metrics", documented_metrics(agent_rows), agent | process,
            "docs/using.md's table of an agent's metrics", "the agent (agent/, status_http/)")

    daemon = metric_families(root, ["store_server"])
    daemon_rows = table_after(read(root, "docs/operating.md").splitlines(), "| metric | type | meaning |")
    documented = documented_metrics(daemon_rows)
    if "process_*" in documented:  # the table names the process metrics by their prefix
        documented.discard("process_*")
        documented |= process
    compare("metrics", documented, daemon | process,
            "docs/operating.md's table of the daemon's metrics",
            "the daemon (store_server/, status_http/)")


# ---- environment ---------------------------------------------------------------------

# A variable's name, as the docs write it in backticks (`RANK`, `DDP_SHM_DISABLE=1`); not
# a family of names (`DDP_STORE_*`, `MASTER_*`).
ENV_NAME = re.compile(r"\b[A-Z][A-Z0-9_]*[A-Z0-9](?![\w*])")


def contract_names(root):
    if not os.path.isfile(os.path.join(root, ENV_CONTRACT)):
        fail(f"environment: {ENV_CONTRACT} is missing: has the contract moved? (ENV_CONTRACT at "
             "the top of this script)")
        return set()
    text = read(root, ENV_CONTRACT)
    code = re.sub(r"//[^\n]*", "", text)
    names = set(re.findall(r'"([A-Z][A-Z0-9_]*)"', code))
    if len(names) < 10:
        fail(f"environment: only {len(names)} names found in {ENV_CONTRACT}: "
             "has the contract moved? (ENV_CONTRACT at the top of this script)")
    return names


def variables_read(root, folders):
    """Variables read by name: getenv("X"), env::get("X"), env::get_bool("X"), ..."""
    pattern = re.compile(r'\b(?:getenv|env::get\w*)\(\s*"([A-Z][A-Z0-9_]*)"')
    names = set()
    for _, text in sources(root, folders):
        names.update(pattern.findall(text))
    return names


def check_environment(root):
    contract = contract_names(root)
    using = "\n".join(section(read(root, "docs/using.md"), "What every worker gets"))
    # The paragraphs up to the worker library's pointer: what the agent puts in the
    # environment (the names in backticks and the torchrun list).
    every_worker = set()
    for chunk in ticked(using):
        every_worker.update(ENV_NAME.findall(chunk))
    agent_literals = set()
    for _, text in sources(root, ["agent", "launcher"]):
        agent_literals.update(re.findall(r'"([A-Z][A-Z0-9_]*)"', text))
    for name in sorted(every_worker - contract - agent_literals):
        fail(f"environment: docs/using.md ('What every worker gets') names '{name}', which "
             f"neither {ENV_CONTRACT} nor the agent's code has")

    lib = read(root, "docs/worker-library.md")
    rows = table_after(section(lib, "Joining"), "| variable | meaning |")
    joining = set()
    for row in rows:
        for chunk in ticked(row[0]):
            joining.update(ENV_NAME.findall(chunk.split("=")[0]))  # `DDP_DEBUG=DETAIL`: the name
    read_by_lib = variables_read(root, ["worker_lib", "common"])
    for name in sorted(joining - contract - read_by_lib):
        fail(f"environment: docs/worker-library.md's table of variables names '{name}', which "
             "the worker library does not read")
    for name in sorted(read_by_lib - joining - every_worker):
        fail(f"environment: the worker library reads '{name}', which docs/worker-library.md's "
             "table of variables does not list")
    for name in sorted(contract - every_worker - joining):
        fail(f"environment: '{name}' ({ENV_CONTRACT}) is in neither docs/using.md's 'What every "
             "worker gets' nor docs/worker-library.md's table of variables")


# ---- fuzz targets --------------------------------------------------------------------

def check_fuzz(root):
    script = read(root, "scripts/fuzz")
    m = re.search(r"^all_targets=\(([^)]*)\)", script, re.M)
    if not m:
        fail("fuzz: no all_targets=(...) in scripts/fuzz")
        return
    targets = set(m.group(1).split())
    header = set(re.findall(r"^#   (\w+_fuzz)\s", script, re.M))
    compare("fuzz", header, targets, "scripts/fuzz's header comment", "all_targets in scripts/fuzz")

    fuzzing = section(read(root, "docs/contributing.md"), "Fuzzing")
    documented = {}
    for line in fuzzing:
        m = re.match(r"- `(\w+_fuzz)` \(`([^`]+)`\)", line)
        if m:
            documented[m.group(1)] = m.group(2).rstrip("/")
    compare("fuzz", set(documented), targets, "docs/contributing.md ('Fuzzing')",
            "all_targets in scripts/fuzz")
    for target, folder in sorted(documented.items()):
        if not os.path.isfile(os.path.join(root, folder, target + ".cc")):
            fail(f"fuzz: docs/contributing.md puts {target} in {folder}/, which has no "
                 f"{target}.cc")


# ---- labels --------------------------------------------------------------------------

def cmake_files(root):
    for dirpath, dirs, files in os.walk(os.path.join(root, "tests")):
        for name in files:
            if name == "CMakeLists.txt":
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, root), f.read()


def cmake_labels(root):
    """The labels the CMake files under tests/ give by name (not the program-name labels)."""
    labels = set()
    for _, text in cmake_files(root):
        text = re.sub(r"#[^\n]*", "", text)
        # LABELS a b, LABELS "a;b" (up to the next keyword or the closing parenthesis)
        for m in re.finditer(r"\bLABELS\s+((?:\"[^\"]*\"|[^\s()]+)(?:\s+(?:\"[^\"]*\"|[a-z_]+))*)",
                             text):
            for word in re.split(r"[\s;\"]+", m.group(1)):
                if re.fullmatch(r"[a-z][a-z0-9_]*", word):
                    labels.add(word)
        # set(labels a b) / list(APPEND labels a): the folders that build label lists
        for m in re.finditer(r"\b(?:set\(labels|list\(APPEND (?:ARG_)?labels)\s+([^)]*)\)", text,
                             re.I):
            labels.update(w for w in m.group(1).split() if re.fullmatch(r"[a-z][a-z0-9_]*", w))
    labels |= set(feature_patterns(root))
    # Program names are labels too ("every test is labelled with its program's name"):
    # they are not category labels, and the docs select them by regex.
    return {label for label in labels if not label.endswith("_test")}


def program_names(root):
    names = set()
    for _, text in cmake_files(root):
        names.update(re.findall(r"ddp_add_gtest\(\s*([\w${}]+)", text))
        names.update(re.findall(r"add_test\(\s*NAME\s+([\w${}.]+)", text))
    return names


def check_labels(root):
    contributing = read(root, "docs/contributing.md")
    given = cmake_labels(root)
    programs = program_names(root)
    documented = set()
    for m in re.finditer(r"ctest --test-dir \S+ -L '?([\w^$|.*]+)'?", contributing):
        label = m.group(1)
        if re.fullmatch(r"[a-z][a-z0-9_]*", label):
            documented.add(label)
        elif not any(re.search(label, p.replace("${name}", "x")) for p in programs):
            fail(f"labels: docs/contributing.md selects -L '{label}', which matches no program")
    phases = "\n".join(section(contributing, "Phases of `./scripts/test`"))
    for m in re.finditer(r"\(labels? ([^)]*)\)", phases):
        documented.update(ticked(m.group(1).split(":")[0]))  # the names before any ':'
    for row in table_after(section(contributing, "Feature labels"), "| label |"):
        documented.update(ticked(row[0]))
    compare("labels", documented, given, "docs/contributing.md", "the CMake files under tests/")


def feature_patterns(root):
    text = read(root, "tests/CMakeLists.txt")
    m = re.search(r"set\(DDP_FEATURE_LABELS ([^)]*)\)", text)
    if not m:
        fail("features: no set(DDP_FEATURE_LABELS ...) in tests/CMakeLists.txt")
        return {}
    patterns = {}
    for label in m.group(1).split():
        p = re.search(r'set\(DDP_FEATURE_%s "([^"]*)"\)' % label, text)
        patterns[label] = p.group(1) if p else ""
        if not p:
            fail(f"features: no pattern DDP_FEATURE_{label} in tests/CMakeLists.txt")
    return patterns


def check_features(root):
    patterns = feature_patterns(root)
    rows = table_after(section(read(root, "docs/contributing.md"), "Feature labels"), "| label |")
    documented = {}
    for row in rows:
        labels = ticked(row[0])
        if len(row) < 3 or len(labels) != 1:
            fail(f"features: a row of the table is not '| `label` | feature | where |': {row}")
            continue
        documented[labels[0]] = row[2]
    compare("features", set(documented), set(patterns), "docs/contributing.md's feature table",
            "DDP_FEATURE_LABELS in tests/CMakeLists.txt")
    for label, where in documented.items():
        pattern = patterns.get(label, "")
        # `tests/x` (`a`, `b`): files of tests/x whose names start with a or b
        for m in re.finditer(r"`(tests/[^`]+)`(?: \(([^)]*)\))?", where):
            path, names = m.group(1), m.group(2)
            full = os.path.join(root, path)
            if not os.path.exists(full):
                fail(f"features: the '{label}' row names {path}, which does not exist")
                continue
            if os.path.isfile(full):
                stems = [os.path.splitext(os.path.basename(path))[0]]
            else:
                stems = ticked(names or "")
                for stem in stems:
                    plain = stem.rstrip("*").rstrip("_")
                    if not any(f.startswith(plain) for _, _, fs in os.walk(full) for f in fs):
                        fail(f"features: the '{label}' row names `{stem}` in {path}, which has "
                             "no file of that name")
            # every file or name the row gives must be one the label's pattern selects
            if not stems and not any(prefix in pattern for prefix in folder_prefixes(path)):
                fail(f"features: the '{label}' row names {path}, none of whose programs the "
                     f"pattern DDP_FEATURE_{label} selects")
            for stem in stems:
                if not selects(pattern, path if os.path.isdir(full) else os.path.dirname(path),
                               stem):
                    fail(f"features: the '{label}' row names `{stem}` in {path}, which the "
                         f"pattern DDP_FEATURE_{label} does not select")


def folder_prefixes(folder):
    """How the programs of a tests/ folder are named: tests/worker_lib/x_test.cc is
    worker_x_test, tests/worker_lib/ddp/x_test.cc ddp_x_test, tests/cluster/x_test.sh
    cluster_x."""
    base = os.path.basename(folder.rstrip("/"))
    return {base + "_", base.split("_")[0] + "_"}


def selects(pattern, folder, stem):
    """Whether `pattern` selects a program or script test made from `stem` in `folder`."""
    stem = stem.rstrip("*")
    bare = re.sub(r"^ddprun_", "", stem)  # tests/launcher/ddprun_x_test.cc: launcher_x_test
    for prefix in folder_prefixes(folder) | {""}:
        for name in {stem, bare}:
            for candidate in (prefix + name, prefix + name + "_test", prefix + name + "x",
                              prefix + re.sub(r"_test$", "", name)):
                if re.fullmatch(pattern, candidate):
                    return True
    return False


# ---- "the only ..." ------------------------------------------------------------------

def check_only(root):
    contributing = read(root, "docs/contributing.md")
    flat = re.sub(r"\s+", " ", contributing)
    # "... X (and Y) is/are the only place(s) that detach(es) a thread"
    # the clause before it: back to a ';' or a full stop (a '.' inside a file name is not one)
    m = re.search(r"((?:[^.;]|\.(?=\S))*) (?:is|are) the only places? that detach", flat)
    if not m:
        fail("only: docs/contributing.md no longer says which files detach a thread "
             "(this check looks for 'the only place that detaches')")
    else:
        named = {os.path.basename(p) for p in ticked(m.group(1))}
        detaching = set()
        pattern = re.compile(r"(?:\bthread\w*|\))\.detach\(\)")
        for path, text in sources(root, PRODUCTION_DIRS):
            code = re.sub(r"//[^\n]*", "", text)
            if pattern.search(code):
                detaching.add(os.path.basename(path))
        compare("only", named, detaching,
                "docs/contributing.md's 'the only place(s) that detach a thread'",
                "the production code (.detach() on a thread)")

    m = re.search(r"The only suppression \(`([^`]+)`\)", flat)
    if m:
        supp_dir = os.path.dirname(m.group(1))
        files = sorted(f for f in os.listdir(os.path.join(root, supp_dir)) if f.endswith(".supp"))
        rules = [line for f in files for line in read(root, os.path.join(supp_dir, f)).splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        if files != [os.path.basename(m.group(1))] or len(rules) != 1:
            fail(f"only: docs/contributing.md says there is one suppression ({m.group(1)}); "
                 f"{supp_dir} has {files} with {len(rules)} rules")



# ---- other lists ---------------------------------------------------------------------

def check_layout(root):
    """docs/design.md's folder table: every top-level folder with a CMakeLists.txt has a row,
    every row's folder exists, and the scripts/ row names what scripts/ holds."""
    rows = table_after(read(root, "docs/design.md").splitlines(), "| folder | what it is |")
    documented = set()
    for row in rows:
        for name in ticked(row[0]):
            documented.add(name.rstrip("/"))
    built = {d for d in os.listdir(root)
             if os.path.isfile(os.path.join(root, d, "CMakeLists.txt"))}
    for name in sorted(built - documented):
        fail(f"layout: {name}/ is a folder of the build, which docs/design.md's layout table "
             "does not list")
    for name in sorted(n for n in documented if not os.path.isdir(os.path.join(root, n))):
        fail(f"layout: docs/design.md's layout table lists {name}/, which does not exist")
    for row in rows:
        if ticked(row[0]) == ["scripts/"]:
            named = set(ticked(row[1]))
            present = set(os.listdir(os.path.join(root, "scripts")))
            compare("layout", named, present, "docs/design.md's scripts/ row", "scripts/")


def check_support(root):
    """docs/contributing.md's table of tests/support's headers against the folder."""
    rows = table_after(section(read(root, "docs/contributing.md"),
                               "The test-support library (`tests/support`)"), "| header | what |")
    documented = {name for row in rows for name in ticked(row[0])}
    present = {f for f in os.listdir(os.path.join(root, "tests/support")) if f.endswith(".h")}
    compare("support", documented, present, "docs/contributing.md's tests/support table",
            "tests/support/")


def check_options(root):
    """The CMake options docs/contributing.md names against the option() and cache variables
    of CMakeLists.txt and cmake/."""
    text = read(root, "CMakeLists.txt")
    for name in sorted(os.listdir(os.path.join(root, "cmake"))):
        if name.endswith(".cmake"):
            text += read(root, os.path.join("cmake", name))
    options = set(re.findall(r"\boption\((DDP_\w+)", text))
    options |= set(re.findall(r"\bset\((DDP_\w+)\s[^)]*\bCACHE\b", text))
    building = "\n".join(section(read(root, "docs/contributing.md"), "Building"))
    m = re.search(r"CMake options:(.*?)\n\n", building, re.S)
    if not m:
        fail("options: docs/contributing.md ('Building') has no 'CMake options:' paragraph")
        return
    documented = {n for n in ticked(m.group(1)) if re.fullmatch(r"DDP_\w+", n)}
    compare("options", documented, options, "docs/contributing.md's CMake options",
            "CMakeLists.txt and cmake/*.cmake")


def check_phases(root):
    """The phases table of docs/contributing.md against scripts/test's phases."""
    m = re.search(r'DDP_TEST_PHASES:-"([^"]*)"', read(root, "scripts/test"))
    if not m:
        fail("phases: no default DDP_TEST_PHASES in scripts/test")
        return
    rows = table_after(section(read(root, "docs/contributing.md"), "Phases of `./scripts/test`"),
                       "| phase | what |")
    documented = [name for row in rows for name in ticked(row[0])]
    if documented != m.group(1).split():
        fail(f"phases: docs/contributing.md's table has the phases {documented}, scripts/test "
             f"runs {m.group(1).split()}")



def check_demo_flags(root):
    """docs/worker-library.md's table of the demo's flags against the flags it declares."""
    declared = set()
    for _, text in sources(root, ["examples/train_fashion_mnist"]):
        declared.update(re.findall(r'\badd_(?:option|flag)\(\s*"(--[a-z0-9-]+)"', text))
    if not declared:
        fail("demo_flags: no add_option/add_flag(\"--...\") in examples/train_fashion_mnist")
    rows = table_after(section(read(root, "docs/worker-library.md"), "The demo"),
                       "| flag | default |")
    documented = set()
    for row in rows:
        for chunk in ticked(row[0]):
            documented.update(re.findall(r"--[a-z0-9-]+", chunk))
    compare("demo_flags", documented, declared, "docs/worker-library.md's table of the demo's "
            "flags", "examples/train_fashion_mnist")


# ---- citations -----------------------------------------------------------------------

def doc_files(root):
    yield "README.md"
    for name in sorted(os.listdir(os.path.join(root, "docs"))):
        if name.endswith(".md"):
            yield os.path.join("docs", name)


def check_citations(root):
    for path in doc_files(root):
        text = read(root, path)
        for m in re.finditer(r"DESIGN\.md|(?<![\w.])/work/", text):
            line = text.count("\n", 0, m.start()) + 1
            fail(f"citations: {path}:{line} cites {m.group(0)}, which is not in the repository")
        for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            full = os.path.normpath(os.path.join(root, os.path.dirname(path), target))
            if not os.path.exists(full):
                line = text.count("\n", 0, m.start()) + 1
                fail(f"citations: {path}:{line} links to {target}, which does not exist")
    for folder in ["cmake", "scripts"]:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    if "DESIGN.md" in f.read():
                        fail(f"citations: {os.path.relpath(path, root)} cites DESIGN.md, which is "
                             "not in the repository")


CHECKS = {
    "metrics": check_metrics,
    "environment": check_environment,
    "fuzz": check_fuzz,
    "labels": check_labels,
    "features": check_features,
    "only": check_only,
    "citations": check_citations,
    "layout": check_layout,
    "support": check_support,
    "options": check_options,
    "phases": check_phases,
    "demo_flags": check_demo_flags,
}


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] not in CHECKS):
        print(f"usage: {argv[0]} SOURCE_DIR [{'|'.join(CHECKS)}]", file=sys.stderr)
        return 2
    root = argv[1]
    for name in ([argv[2]] if len(argv) == 3 else CHECKS):
        CHECKS[name](root)
    for message in failures:
        print(message)
    if failures:
        print(f"{len(failures)} difference(s) between docs/ and the code")
        return 1
    print("docs and code agree: " + ", ".join([argv[2]] if len(argv) == 3 else CHECKS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
