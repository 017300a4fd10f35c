"""The type stubs (python/qkv/*.pyi, shipped beside the modules with py.typed) say what the
modules are: every public name, and every stubbed function's parameters (names, kinds and
defaults), as the running module has them. A change to a module's signatures fails here until
its stub follows."""

import ast
import dataclasses
import importlib
import inspect
import pathlib

import pytest

import qkv
from qkv import _qkv

PACKAGE = pathlib.Path(qkv.__file__).parent
# The stubs of the pure-Python modules; _qkv.pyi (the extension) is checked by name below, and
# _types.pyi holds type aliases only (it has no module at run time).
STUBBED_MODULES = ["_attention", "_layer", "_explain", "_io", "_kv_cache", "_bench", "_ring"]

KINDS = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY,
         "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def stub(name):
    return ast.parse((PACKAGE / f"{name}.pyi").read_text(encoding="utf-8"))


def decorators(node):
    return {d.id for d in node.decorator_list if isinstance(d, ast.Name)}


def stub_parameters(node):
    """(name, kind, default) of each parameter of a stub def; default is inspect's `empty`
    when there is none."""
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    kinds = [KINDS["posonlyargs"]] * len(args.posonlyargs) + [KINDS["args"]] * len(args.args)
    found = [(a.arg, kind, default) for a, kind, default in zip(positional, kinds, defaults)]
    if args.vararg:
        found.append((args.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for a, default in zip(args.kwonlyargs, args.kw_defaults):
        found.append((a.arg, KINDS["kwonlyargs"],
                      inspect.Parameter.empty if default is None else ast.literal_eval(default)))
    if args.kwarg:
        found.append((args.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return found


def runtime_parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def check_function(node, function, where):
    expected = stub_parameters(node)
    if "classmethod" in decorators(node):
        expected = expected[1:]  # cls: bound at run time
    assert runtime_parameters(function) == expected, f"{where}: the stub's parameters differ"


def check_class(node, cls, where):
    fields = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]
    if hasattr(cls, "_fields"):  # a namedtuple
        assert list(cls._fields) == fields, f"{where}: the stub's fields differ"
    elif dataclasses.is_dataclass(cls):
        assert [f.name for f in dataclasses.fields(cls)] == fields, f"{where}: fields differ"
    for member in node.body:
        if not isinstance(member, ast.FunctionDef):
            continue
        name = f"{where}.{member.name}"
        attribute = inspect.getattr_static(cls, member.name, None)
        assert attribute is not None, f"{name}: in the stub, not in the class"
        if "property" in decorators(member):
            assert isinstance(attribute, property), f"{name}: a property in the stub only"
        else:
            check_function(member, getattr(cls, member.name), name)
    stubbed = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    public = {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    public |= {n for n, v in vars(cls).items() if isinstance(v, property)}
    assert public <= stubbed | set(fields), f"{where}: not in the stub: {public - stubbed}"


@pytest.mark.parametrize("module_name", STUBBED_MODULES)
def test_stub_matches_module(module_name):
    module = importlib.import_module(f"qkv.{module_name}")
    tree = stub(module_name)
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
            where = f"qkv.{module_name}.{node.name}"
            assert hasattr(module, node.name), f"{where}: in the stub, not in the module"
            if isinstance(node, ast.ClassDef):
                check_class(node, getattr(module, node.name), where)
            else:
                check_function(node, getattr(module, node.name), where)
        elif isinstance(node, ast.ImportFrom):
            defined.update(a.asname for a in node.names if a.asname == a.name)  # re-exports
        elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            assert ast.literal_eval(node.value) == module.__all__, f"qkv.{module_name}: __all__"
    missing = set(getattr(module, "__all__", [])) - defined
    assert not missing, f"qkv.{module_name}: public but not in the stub: {sorted(missing)}"


def test_every_public_name_has_a_stub():
    stubbed = set()
    for module_name in STUBBED_MODULES + ["_qkv"]:
        for node in stub(module_name).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                stubbed.add(node.name)
            elif isinstance(node, ast.AnnAssign):
                stubbed.add(node.target.id)
    assert set(qkv.__all__) - stubbed == set()


def test_extension_stub_names_what_the_extension_has():
    tree = stub("_qkv")
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    present = {n for n in dir(_qkv) if not n.startswith("__")} | {"__version__"}
    assert names == present
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(_qkv, node.name)
            if issubclass(cls, BaseException):
                continue  # qkv.Error, qkv.FileError: their stubs add only the attributes
            members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
            members.discard("__init__")
            public = {n for n in dir(cls) if not n.startswith("_")} | (members & {"_repr_html_"})
            annotated = {m.target.id for m in node.body if isinstance(m, ast.AnnAssign)}
            assert members | annotated == public | annotated, f"_qkv.{node.name}"


def test_package_is_marked_typed():
    assert (PACKAGE / "py.typed").is_file()
