"""Errors a user sees. Every bad input becomes one EqfuseError with a position when there is one.

The command line prints `str(err)` and exits 2; nothing here ever shows a Python traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SHOWN = 100  # characters of a source line shown above the caret


@dataclass(frozen=True)
class Pos:
    """A position in a source text: 1-based line and column, plus the text of that line."""

    file: str
    line: int
    col: int
    text: str = ""  # the whole source line, for the caret display
    width: int = 1  # how many characters the caret underlines

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class EqfuseError(Exception):
    """Bad input or usage (exit status 2 on the command line)."""

    exit_status = 2

    def __init__(self, message: str, pos: Pos | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.hint = hint

    def __str__(self) -> str:
        head = f"{self.pos}: error: {self.message}" if self.pos else f"error: {self.message}"
        lines = [head]
        if self.pos and self.pos.text:
            src = self.pos.text.rstrip("\n").expandtabs(1)
            col, width = self.pos.col - 1, max(1, self.pos.width)
            if len(src) > MAX_SHOWN:  # show a window around the caret, not a 10k-character line
                start = max(0, min(col - MAX_SHOWN // 2, len(src) - MAX_SHOWN))
                src = ("..." if start else "") + src[start:start + MAX_SHOWN] + "..."
                col = col - start + (3 if start else 0)
                width = min(width, MAX_SHOWN)
            lines.append("    " + src)
            lines.append("    " + " " * col + "^" * width)
        if self.hint:
            lines.append(f"note: {self.hint}")
        return "\n".join(lines)


class DimsNeeded(EqfuseError):
    """An ONNX model that imports only with some of its named dims bound (eqfuse.compile then
    binds them per call, padded to buckets: eqfuse.runtime.padded). `sums` holds the dims a
    concat adds together (NamedSum): padding them with zeros is not exact, so they are compiled
    per value."""

    sums: tuple[str, ...] = ()


class ChunkRefused(EqfuseError):
    """A live step over several new rows (a prompt's chunk) that cannot take the run-time length:
    its attention reads a mask computed at run time (eqfuse.backend.live). eqfuse.generate then
    prefills the prompt whole, as a model without a live step does."""


class RuntimeDimRefused(EqfuseError):
    """compile's live= on a dim no KV cache holds (a run-time loop bound, eqfuse.backend.runtime_dim)
    where a kernel of the graph cannot take the dim's value at run time: the message names the
    kernel. eqfuse.runtime.padded then pads the dim to buckets instead."""


class ShapeError(Exception):
    """Raised by an op's shape rule; the graph builder turns it into an EqfuseError at the op."""


class NamedSum(ShapeError):
    """A shape rule whose result dim is a sum with a named dim in it (concat along a named axis:
    past + sequence). The IR's Dim is an int or one name, so it cannot hold the sum: the graph
    builds once those names are bound. The ONNX importer raises it as DimsNeeded, so the model
    is bound per call (eqfuse.runtime.padded); a .g graph needs them bound by dims=."""

    def __init__(self, message: str, names: tuple[str, ...]):
        super().__init__(message)
        self.names = names


class CheckFailed(EqfuseError):
    """A check ran and failed: a verification mismatch or an unsound rule (exit status 1)."""

    exit_status = 1


class RuleError(EqfuseError):
    """A user rule file was refused: a rule is unsound or cannot be tested (exit status 2)."""


class ArgumentError(EqfuseError, TypeError):
    """A compiled or reference function was called with the wrong arrays."""


def did_you_mean(word: str, options) -> str | None:
    """The hint for a misspelt name: the closest of `options`, if any is close. A name of two or
    three characters with one of them wrong ('b3' for 'b1') scores 0.5, under difflib's 0.6."""
    import difflib

    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5 if len(word) <= 3 else 0.6)
    return f"did you mean '{close[0]}'?" if close else None
