"""The one escaping helper of ``visualize``. Trace records are untrusted input (a saved trace can be
shared and uploaded), so every value that goes into HTML, or into Plotly text (titles, tick labels,
marker labels and hover texts, which render a subset of HTML), passes ``esc``, ``num`` or ``plot_text`` — numbers
too: a crafted file can hold markup where a number belongs. Literal markup written in this package
is the only HTML that is not escaped."""

from __future__ import annotations

from html import escape


def esc(value) -> str:
    """``value`` as text that is safe inside an HTML element or a quoted attribute."""
    return escape(str(value), quote=True)


def plot_text(value) -> str:
    """``value`` as Plotly text (a title, label or hover text): ``<`` ``>`` ``&`` escaped, and quotes as
    numeric references, which Plotly decodes (it shows ``&quot;`` literally)."""
    return escape(str(value), quote=False).replace('"', "&#34;")


def num(value, spec: str = "") -> str:
    """A number formatted with ``spec`` (``".3f"``, ``".1f"``), escaped like any other value."""
    return esc(format(value, spec))


def join(values, sep: str = ", ") -> str:
    """Escaped values joined by a (literal) separator."""
    return sep.join(esc(v) for v in values)
