"""plugins/strategy/raymetal_linear.py: Mitogen when it is installed, plain linear otherwise."""

import importlib.util
import os
import sys

import ansible.plugins.strategy.linear as linear

PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "strategy", "raymetal_linear.py")


def load(monkeypatch, without_mitogen):
    if without_mitogen:
        monkeypatch.setitem(sys.modules, "ansible_mitogen", None)  # makes `import ansible_mitogen` fail
        monkeypatch.setitem(sys.modules, "ansible_mitogen.loaders", None)
        monkeypatch.setitem(sys.modules, "ansible_mitogen.strategy", None)
    spec = importlib.util.spec_from_file_location("raymetal_linear_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uses_mitogen_when_installed(monkeypatch):
    module = load(monkeypatch, without_mitogen=False)
    import ansible_mitogen.strategy
    assert module.MITOGEN
    assert issubclass(module.StrategyModule, ansible_mitogen.strategy.StrategyMixin)
    assert issubclass(module.StrategyModule, linear.StrategyModule)


def test_falls_back_to_linear_without_mitogen(monkeypatch):
    module = load(monkeypatch, without_mitogen=True)
    assert not module.MITOGEN
    assert issubclass(module.StrategyModule, linear.StrategyModule)
    assert not any(c.__module__.startswith("ansible_mitogen") for c in module.StrategyModule.__mro__)
