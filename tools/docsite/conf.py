# Copyright (c) Ansible Project
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Created with antsibull-docs 2.28.0

# This file only contains a selection of the most common options. For a full list see the
# documentation:
# http://www.sphinx-doc.org/en/master/config

project = 'raymetal'
copyright = 'raymetal contributors'

title = 'raymetal.cluster'
html_short_title = 'raymetal.cluster'

extensions = ['sphinx.ext.autodoc', 'sphinx.ext.intersphinx', 'sphinx_antsibull_ext']

pygments_style = 'ansible'

highlight_language = 'YAML+Jinja'

html_theme = 'sphinx_ansible_theme'
html_show_sphinx = False

display_version = False

html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False

# raymetal: no intersphinx inventories. The build runs offline (make lint, CI): Sphinx would try to
# download each inventory and warn when it cannot, and -W makes that warning an error. References to
# ansible-core's docs stay plain text instead of links.
intersphinx_mapping = {}

default_role = 'any'

nitpicky = True


# raymetal: without intersphinx, the pages' references into Ansible's own docs (another collection's plugin,
# ansible-core's reference pages) would be undefined labels, which -W fails. They resolve here to their pages
# on docs.ansible.com, by the label scheme antsibull-docs uses; any other undefined label, a broken reference
# inside raymetal.cluster above all, still warns and fails the build.
ANSIBLE_DOCS = 'https://docs.ansible.com/projects/ansible/latest/'
ANSIBLE_CORE_LABELS = {
    'ansible_configuration_settings': 'reference_appendices/config.html',
    'common_return_values': 'reference_appendices/common_return_values.html',
}
OWN_PREFIX = 'ansible_collections.raymetal.cluster.'


def _ansible_docs_url(label):
    if label in ANSIBLE_CORE_LABELS:
        return ANSIBLE_DOCS + ANSIBLE_CORE_LABELS[label]
    parts = label.split('.')
    # ansible_collections.<namespace>.<name>.<plugin>_<type>, e.g. ansible_collections.ansible.builtin.copy_module
    if len(parts) == 4 and parts[0] == 'ansible_collections' and not label.startswith(OWN_PREFIX):
        return ANSIBLE_DOCS + 'collections/%s/%s/%s.html' % tuple(parts[1:])
    return None


def _resolve_ansible_docs(app, env, node, contnode):
    if node.get('reftype') not in ('ref', 'any'):
        return None
    url = _ansible_docs_url(node.get('reftarget', ''))
    if url is None:
        return None
    from docutils import nodes
    ref = nodes.reference('', '', internal=False, refuri=url)
    ref += contnode
    return ref


def setup(app):
    app.connect('missing-reference', _resolve_ansible_docs)
