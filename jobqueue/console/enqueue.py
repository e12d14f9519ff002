"""Enqueue a job from the console: a registered handler, JSON args and kwargs and the options
`enqueue` takes, checked by `enqueue` itself (its error is shown on the form, beside the option
it names), behind its own permission (`jobqueue.enqueue_job`). A CSRF-protected POST that logs
an admin LogEntry and leads to the new job's page.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.mixins import PermissionRequiredMixin
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views import View

from ..api.registry import enqueue, lookup, registered
from ..exceptions import InvalidJobId, InvalidOption, JobQueueError, UnknownHandler
from ..models import Job
from ..operations.checks import autodiscover_jobs
from ..states import State
from . import access, actions
from .site import ConsoleSite, console_reverse

NUMBERS = {
    "priority": int,
    "max_attempts": int,
    "delay": float,
    "backoff": float,
    "lease": float,
    "timeout": float,
    "expires": float,
    "debounce": float,
}
TEXTS = ("queue", "lane", "unique_key", "job_id")
OPTIONS = (*TEXTS[:2], *NUMBERS, *TEXTS[2:])
"""The enqueue options the form offers (`enqueue`'s keywords; seconds for the durations)."""


class EnqueueForm(forms.Form):
    handler = forms.ChoiceField(help_text="A registered @job handler.")
    args = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        initial="[]",
        required=False,
        help_text="A JSON list.",
    )
    kwargs = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        initial="{}",
        required=False,
        help_text="A JSON object.",
    )
    queue = forms.CharField(required=False, help_text="Blank: the handler's queue.")
    lane = forms.CharField(required=False)
    priority = forms.IntegerField(required=False, help_text="−100…100")
    delay = forms.FloatField(required=False, help_text="Seconds before it may run.")
    max_attempts = forms.IntegerField(required=False)
    backoff = forms.FloatField(required=False, help_text="Seconds: a retry's backoff base.")
    lease = forms.FloatField(required=False, help_text="Seconds.")
    timeout = forms.FloatField(required=False, help_text="Seconds a run may take.")
    expires = forms.FloatField(required=False, help_text="Seconds from now: expired if not started by then.")
    debounce = forms.FloatField(required=False, help_text="Seconds (needs a unique key).")
    unique_key = forms.CharField(required=False)
    job_id = forms.CharField(required=False, help_text="Blank: a new id.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        autodiscover_jobs()
        self.fields["handler"].choices = [("", "—"), *((n, n) for n in registered())]  # type: ignore[attr-defined]

    def clean_args(self) -> list[Any]:
        value = _json(self.cleaned_data["args"] or "[]", "args")
        if not isinstance(value, list):
            raise forms.ValidationError('args must be a JSON list, such as [1, "two"]')
        return value

    def clean_kwargs(self) -> dict[str, Any]:
        value = _json(self.cleaned_data["kwargs"] or "{}", "kwargs")
        if not isinstance(value, dict):
            raise forms.ValidationError('kwargs must be a JSON object, such as {"order": 7}')
        return value

    def options(self) -> dict[str, Any]:
        """The options given (blank ones are the handler's)."""
        return {
            name: self.cleaned_data[name] for name in OPTIONS if self.cleaned_data.get(name) not in (None, "")
        }

    def refuse(self, exc: JobQueueError) -> None:
        """`enqueue`'s error, on the field of the option it names (else above the form)."""
        text = str(exc)
        named = next(
            (
                name
                for name in ("handler", *OPTIONS)
                for said in {name, name.replace("_", " ")}
                if text.startswith((said, f"'{said}'", f"invalid {said}"))
            ),
            None,
        )
        if isinstance(exc, InvalidJobId):
            named = "job_id"
        self.add_error(named, text)


def _json(raw: str, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise forms.ValidationError(f"{what} is not JSON: {exc}") from None


class EnqueueJob(PermissionRequiredMixin, View):
    """The form (GET) and the enqueue (POST)."""

    permission_required = actions.PERMISSIONS["enqueue"]
    raise_exception = True
    site: ConsoleSite | None = None

    def _site(self) -> ConsoleSite:
        if self.site is None:
            raise ImproperlyConfigured("mount EnqueueJob with as_view(site=…)")
        return self.site

    def get(self, request: HttpRequest) -> HttpResponse:
        initial = {"handler": request.GET.get("handler", "")}
        return self._site().render(
            request, "enqueue.html", "Enqueue a job", form=EnqueueForm(initial=initial)
        )

    def post(self, request: HttpRequest) -> HttpResponse:
        site, form = self._site(), EnqueueForm(request.POST)
        if form.is_valid():
            data, options = form.cleaned_data, form.options()
            try:
                self._check_queue(request, data["handler"], options.get("queue"))
                ref = enqueue(data["handler"], data["args"], data["kwargs"], immediate=True, **options)
            except JobQueueError as exc:
                form.refuse(exc)
            else:
                note = "" if ref.created else " (its unique key matched a live job: this is that job)"
                message = f"Enqueued job {ref.id} ({data['handler']}) in queue {ref.queue}{note}."
                actions.log_action(
                    request.user, Job(id=ref.id, queue=ref.queue, state=State.PENDING), message
                )
                messages.success(request, message)
                return HttpResponseRedirect(console_reverse(request, "jobqueue_job", ref.queue, ref.id))
        return site.render(request, "enqueue.html", "Enqueue a job", status=400, form=form)

    def _check_queue(self, request: HttpRequest, handler: str, queue: str | None) -> None:
        """A user enqueues only into the queues they may act on (`access.may_act`)."""
        try:
            target = queue or lookup(handler).options.queue
        except UnknownHandler:
            target = queue or "default"
        if not access.may_act(request, target):
            raise InvalidOption(f"queue: you may not enqueue into {target!r}")
