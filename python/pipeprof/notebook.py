"""``%load_ext pipeprof`` and the ``%%pipeprof`` cell magic (Jupyter, Colab, Kaggle, IPython).

    %load_ext pipeprof

    %%pipeprof --summary s.json
    for xs, ys in loader:
        ...

The cell runs profiled with ``pipeprof run``'s hooks, armed for the cell only
(:class:`pipeprof._profile.Profile`); its output is the report (:class:`pipeprof._report.Report`,
HTML in a notebook, text in a terminal IPython), also ``pipeprof.last()``. A cell that raises
(or is interrupted) shows the report of what ran, then raises as it would without pipeprof.
The cell's last expression is run, not shown: the cell's output is the report.

Imported only by ``%load_ext pipeprof`` (``pipeprof.load_ipython_extension``): ``import
pipeprof`` never imports IPython.
"""

from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from pipeprof._profile import Profile


@magics_class
class PipeprofMagics(Magics):
    """The ``%%pipeprof`` magic."""

    @magic_arguments()
    @argument("--summary", metavar="FILE", help="also write the summary JSON here")
    @argument("--trace", metavar="FILE", help="also write a Chrome/Perfetto trace here")
    @argument("--no-gpu", action="store_true", help="do not sample the GPU")
    @argument("--html", metavar="FILE", help="also write the HTML report here")
    @cell_magic
    def pipeprof(self, line, cell):
        """Profiles the cell with pipeprof run's zero-code hooks; the cell's output is the report."""
        args = parse_argstring(self.pipeprof, line)
        code = self._compile(cell)
        profile = Profile(summary=args.summary, trace=args.trace, no_gpu=args.no_gpu, html=args.html, program="notebook")
        try:
            with profile:
                exec(code, self.shell.user_global_ns, self.shell.user_ns)
        except BaseException:
            if profile.result is not None:
                display(profile.result)
            raise
        return profile.result

    def _compile(self, cell):
        """The cell as IPython would run it (its ``!`` and ``%`` lines transformed), compiled
        under a name IPython's tracebacks show the cell's lines for."""
        source = self.shell.transform_cell(cell)
        try:
            filename = self.shell.compile.cache(source, self.shell.execution_count, raw_code=cell)
        except TypeError:  # an IPython before 8: no raw_code
            filename = self.shell.compile.cache(source, self.shell.execution_count)
        return self.shell.compile(source, filename, "exec")


def load_ipython_extension(ipython):
    """What ``%load_ext pipeprof`` runs."""
    ipython.register_magics(PipeprofMagics)
