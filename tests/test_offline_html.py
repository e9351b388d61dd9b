"""Feedback HTML needs no network: TeX becomes MathML, CDN scripts go."""

from instructor.offline_html import tex_to_mathml, without_remote_scripts


def test_inline_and_display_math_become_mathml():
    out = tex_to_mathml(r"The scale is $\sqrt{d_{head}}$ and $$\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$$")
    assert out.count("<math") == 2 and 'display="block"' in out
    assert "$" not in out


def test_code_and_prices_are_left_alone():
    text = "Run `echo $HOME` and ```\nx = '$a$'\n``` costs $5 or $6."
    assert tex_to_mathml(text) == text


def test_cdn_scripts_are_removed_and_local_ones_kept():
    html = (
        '<script type="text/x-mathjax-config">MathJax.Hub.Config({})</script>'
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX"></script>'
        "<script>var local = 1;</script>"
    )
    assert without_remote_scripts(html) == "<script>var local = 1;</script>"
