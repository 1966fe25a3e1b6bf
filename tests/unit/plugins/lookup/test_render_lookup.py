"""raymetal.cluster.render (plugins/lookup/render.py): ansible.builtin.template's lookup, run on a shallow copy of the
task's variables. The same result as the template lookup, the variables neither deep-copied nor changed."""

from __future__ import annotations

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.lookup.template import LookupModule as TemplateLookup
from ansible.template import Templar

from ansible_collections.raymetal.cluster.plugins.lookup.render import LookupModule as RenderLookup

TEMPLATE = "{{ greeting }} {{ nodes | join(',') }} from {{ template_path | basename }}\n{% for n in nodes %}{{ n }}\n{% endfor %}"
OPTIONS = {"template_vars": {}, "variable_start_string": "{{", "variable_end_string": "}}",
           "comment_start_string": "{#", "comment_end_string": "#}", "trim_blocks": True}


class NoDeepCopy(dict):
    """A variable that fails the render if anything deep-copies it."""

    def __deepcopy__(self, memo):
        raise AssertionError("deep-copied")


def render(lookup_class, tmp_path, variables):
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "t.j2").write_text(TEMPLATE)
    loader = DataLoader()
    lookup = lookup_class(loader=loader, templar=Templar(loader=loader, variables=variables))
    # The options as Ansible's plugin loader sets them from the call (none given: the documented defaults).
    lookup.set_options = lambda **_: None
    lookup.get_option = OPTIONS.get
    return lookup.run(["t.j2"], variables=variables)


def variables(tmp_path, big):
    return {"greeting": "hello", "nodes": ["head", "w1"], "big": big, "ansible_search_path": [str(tmp_path)]}


def test_render_gives_what_the_template_lookup_gives(tmp_path):
    ours = render(RenderLookup, tmp_path, variables(tmp_path, {"a": [1, 2]}))
    upstream = render(TemplateLookup, tmp_path, variables(tmp_path, {"a": [1, 2]}))
    assert ours == upstream == ["hello head,w1 from t.j2\nhead\nw1\n"]


def test_render_copies_the_variables_shallowly_and_leaves_them_as_they_were(tmp_path):
    given = variables(tmp_path, NoDeepCopy(a=[1, 2]))
    before = dict(given)
    assert render(RenderLookup, tmp_path, given) == ["hello head,w1 from t.j2\nhead\nw1\n"]
    # No template_* name (nor anything else) added to the task's variables.
    assert given == before and "template_path" not in given
    # The upstream lookup deep-copies every variable for each template: what this lookup is for.
    with pytest.raises(AssertionError, match="deep-copied"):
        render(TemplateLookup, tmp_path, variables(tmp_path, NoDeepCopy(a=[1, 2])))
