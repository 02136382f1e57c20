"""A setting is written once: a process's settings model generates its click options and argv.

Each process (`mocker serve`, `lab sidecar`, `lab frontend`) has one `Settings` model whose
fields carry the default, the bounds (`ge`/`gt`/`le`/`lt`) and the help (`setting(...)`).
`@options(Model)` turns the model into the command's click options and hands the command one
validated instance; `Model(...).to_argv()` is the command line that reproduces it (the
launcher's). Adding a setting is adding one field.

    class SidecarSettings(Settings):
        stall: float = setting(2.0, "Seconds without progress ...", gt=0)

    @click.command()
    @options(SidecarSettings)
    def sidecar(settings: SidecarSettings) -> None: ...
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import annotated_types as at
import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from lab.shared.switches import ON_OFF, is_on, on_off

__all__ = ["MAX_SECONDS", "Settings", "field_like", "field_option", "field_options",
           "fields_of", "flag_of", "given_or_default", "option_names", "options",
           "parse_settings", "run_value", "setting", "to_argv"]

S = TypeVar("S", bound="Settings")

#: The longest duration any setting accepts, in seconds (about 11.6 days): a bound, so that a
#: mistyped huge value is refused by name instead of meaning "forever" in one place and an
#: overflow in another.
MAX_SECONDS = 1e6
#: The largest seed: the engine hashes it as 8 little-endian bytes.
MAX_SEED = 2**64 - 1


class Settings(BaseModel):
    """A process's settings: frozen, unknown keys rejected, floats finite (no NaN/inf)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def to_argv(self) -> list[str]:
        """The flags that reproduce the fields given at construction (unset ones: defaults)."""
        return to_argv(self)


@dataclass(frozen=True)
class Cli:
    """How one field appears on the command line (kept in the field's json_schema_extra)."""

    flag: str | None = None  # default: --field-name
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    case_sensitive: bool = True
    metavar: str | None = None
    on_off: bool = False  # a bool spelled `on` / `off`
    negation: str | None = None  # a bool switch `--flag/--negation`; None: a plain flag
    default_text: str | None = None  # shown as [default: ...] instead of the default
    parse: Callable[[Any], Any] | None = None  # text -> value; ValueError = bad input
    format: Callable[[Any], list[str]] | None = None  # value -> one argument per flag
    multiple: bool = False
    hidden: bool = False  # not in --help (an internal option)
    path: click.Path | None = None  # a path option's click checks (exists, file or directory)
    #: False: a value the program fills in as it runs (e.g. a level's duration), no option
    command_line: bool = True


def setting(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, required: bool = False,
            choices: Sequence[str] | None = None, **cli: Any) -> Any:
    """A field with its default, bounds and help, plus how it is spelled on the command line
    (the keywords of `Cli`)."""
    meta = Cli(choices=tuple(choices) if choices is not None else None, **cli)
    return Field(
        ... if required else default, ge=ge, gt=gt, le=le, lt=lt, description=help,
        json_schema_extra=cast(Any, {"cli": meta}),
    )


def run_value(default: Any, help: str) -> Any:
    """A field that is no option: a value the program sets as it runs (`model_copy(update=)`),
    kept in the same model so that what a component runs on is one instance."""
    return Field(default, description=help,
                 json_schema_extra=cast(Any, {"cli": Cli(command_line=False)}))


_KEEP: Any = object()


def fields_of(model: Any) -> dict[str, FieldInfo]:
    """The pydantic fields of a model or of a pydantic dataclass (e.g. launch.topology's)."""
    found = getattr(model, "__pydantic_fields__", None)
    return dict(found if found is not None else model.model_fields)


def flag_of(model: Any, name: str) -> str:
    """The flag of `model`'s field `name` (`--field-name` unless the field says otherwise)."""
    return _flag(name, fields_of(model)[name])


def field_like(model: Any, name: str, *, default: Any = _KEEP,
               help: str | None = None, **cli: Any) -> Any:
    """A field defined as `model`'s field `name` is: the same default, bounds, help and
    spelling, except what is given (`cli`: the keywords of `Cli`, e.g. flag=). For a command
    whose option is another's setting (`lab nagle --isl` is `lab sweep --isl`), or a
    topology field that is a process's setting (`launch.topology.FleetSpec`)."""
    info = fields_of(model)[name]
    bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt")
              if hasattr(m, k)}
    meta = dataclasses.replace(_cli(info), **cli)
    if default is _KEEP:
        default = ... if info.is_required() else info.default
    return Field(default, description=help or info.description,
                 json_schema_extra=cast(Any, {"cli": meta}), **bounds)


def given_or_default(model: Any, name: str, help: str | None = None,
                     **cli: Any) -> Any:
    """`field_like`, but default None ("not given", so that a value from another source, e.g.
    a topology file, stands); the help shows the field's default.

    For the options of a launcher (`lab up`) that set a process's own setting."""
    info = fields_of(model)[name]
    own = _cli(info)
    shown = own.default_text
    if shown is None and not info.is_required() and info.default is not None:
        value = info.default
        shown = (own.format(value)[0] if own.format is not None else on_off(value)
                 if own.on_off else f"{value:g}" if isinstance(value, float) else str(value))
    return field_like(model, name, default=None, help=help, **{"default_text": shown, **cli})


def _cli(info: FieldInfo) -> Cli:
    extra = info.json_schema_extra
    return extra["cli"] if isinstance(extra, dict) and "cli" in extra else Cli()  # type: ignore[return-value]


def _flag(name: str, info: FieldInfo) -> str:
    return _cli(info).flag or "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    """`float | None` -> float."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (a range check lets nan through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def _bounds(info: FieldInfo) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in info.metadata:
        if isinstance(m, at.Ge):
            out.update(min=m.ge)
        elif isinstance(m, at.Gt):
            out.update(min=m.gt, min_open=True)
        elif isinstance(m, at.Le):
            out.update(max=m.le)
        elif isinstance(m, at.Lt):
            out.update(max=m.lt, max_open=True)
    return out


def _click_type(info: FieldInfo, cli: Cli) -> Any:
    if cli.path is not None:
        return cli.path
    if cli.choices is not None:
        return click.Choice(cli.choices, case_sensitive=cli.case_sensitive)
    if cli.on_off:
        return ON_OFF
    base = _base_type(info.annotation)
    bounds = _bounds(info)
    if base is int:
        return click.IntRange(**bounds) if bounds else click.INT
    if base is float:
        return FiniteFloatRange(**bounds)
    return click.STRING


def _callback(cli: Cli) -> Callable[..., Any] | None:
    if cli.parse is None and not cli.on_off:
        return None

    def convert(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        if cli.on_off:
            return is_on(value)
        assert cli.parse is not None
        try:
            return cli.parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return convert


def field_option(model: type[Settings], name: str, decls: tuple[str, ...] | None = None,
                 **overrides: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(param decls, click.option kwargs) of one field: its type, bounds, help and default.

    `decls` renames the option (its parameter name then follows the flag); `overrides` replace
    kwargs, e.g. default=None for an option that only overrides another source (the help then
    still shows the field's default, unless `help` is overridden too)."""
    info = model.model_fields[name]
    cli = _cli(info)
    flag = _flag(name, info)
    required = info.is_required()
    default = None if required else info.default
    kwargs: dict[str, Any] = dict(help=info.description or "", required=required)
    if _base_type(info.annotation) is bool and not cli.on_off:
        own: tuple[str, ...] = (f"{flag}/{cli.negation}" if cli.negation else flag, *cli.aliases)
        kwargs.update(default=default)
        if cli.negation is None:
            kwargs["is_flag"] = True
    else:
        own = (flag, *cli.aliases)
        if cli.multiple:
            default = ()
        elif cli.format is not None and default is not None:
            # a parsed value (e.g. a list) reaches click as the text that parses back to it
            (default,) = cli.format(default)
        elif cli.on_off and default is not None:
            default = on_off(default)
        kwargs.update(type=_click_type(info, cli), default=default, multiple=cli.multiple)
        if cli.metavar:
            kwargs["metavar"] = cli.metavar
    callback = _callback(cli)
    if callback is not None:
        kwargs["callback"] = callback
    if cli.hidden:
        kwargs["hidden"] = True
    # click puts a text default in parentheses; the help carries it instead, as written.
    shown = cli.default_text
    if shown is None and default is not None and not required and not cli.multiple:
        shown = str(default)
        kwargs["show_default"] = overrides.get("default", default) is not None
    if shown is not None and not kwargs.get("show_default"):
        kwargs["help"] += f"  [default: {shown}]"
    kwargs.update(overrides)
    return (decls if decls is not None else (*own, name)), kwargs


def _usage_error(model: type[Settings], exc: ValidationError) -> click.UsageError:
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = err.get("loc") or ()
    if loc and loc[0] in model.model_fields:
        name = str(loc[0])
        return click.BadParameter(msg, param_hint=f"'{_flag(name, model.model_fields[name])}'")
    return click.UsageError(msg)


def option_names(model: type[Settings]) -> list[str]:
    """The fields of `model` that are command-line options (not `run_value`s)."""
    return [name for name, info in model.model_fields.items() if _cli(info).command_line]


def parse_settings(model: type[S], params: dict[str, Any]) -> S:
    """The instance of `model` from a command's parsed option values (click.Context.params);
    a failed cross-field check is a click usage error naming the option."""
    try:
        return model(**{k: params[k] for k in option_names(model) if k in params})
    except ValidationError as exc:
        raise _usage_error(model, exc) from None


def options(model: type[S], param: str = "settings") -> Callable[[Callable[..., Any]],
                                                                  Callable[..., Any]]:
    """Add every field of `model` as a click option; the command receives one validated
    instance as `param` (and its other parameters as given)."""
    names = option_names(model)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            instance = parse_settings(model, kwargs)
            rest = {k: v for k, v in kwargs.items() if k not in names}
            return func(**{param: instance}, **rest)

        return field_options(model)(command)

    return decorate


def field_options(model: type[Settings]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add every field of `model` as a click option, its value passed on as a keyword of its
    own (`options` gathers them into one instance; a command that hands them on to a function
    taking keywords, e.g. `launch.cli_options.spec_from_options`, uses this)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(option_names(model)):
            decls, kwargs = field_option(model, name)
            func = click.option(*decls, **kwargs)(func)
        return func

    return decorate


def _words(value: Any, cli: Cli) -> list[str]:
    if cli.format is not None:
        return cli.format(value)
    if cli.on_off:
        return [on_off(value)]
    if isinstance(value, float):
        return [repr(value)]
    return [str(value)]


def to_argv(settings: Settings) -> list[str]:
    """The command-line flags of the fields set at construction (None: not passed)."""
    argv: list[str] = []
    fields = type(settings).model_fields
    for name, info in fields.items():
        if name not in settings.model_fields_set or not _cli(info).command_line:
            continue
        value = getattr(settings, name)
        cli = _cli(info)
        flag = _flag(name, info)
        if value is None:
            continue
        if isinstance(value, bool) and not cli.on_off:
            if value:
                argv.append(flag)
            elif cli.negation:
                argv.append(cli.negation)
            continue
        for word in _words(value, cli):
            argv += [flag, word]
    return argv
