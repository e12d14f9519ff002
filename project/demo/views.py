"""The codemojex page: the game's board, refreshed every two seconds."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from . import codemojex


def game(request: HttpRequest) -> HttpResponse:
    return render(request, "codemojex.html", {"rows": codemojex.board(), "words": codemojex.WORDS,
                                              "flooder": codemojex.FLOODER,
                                              "rounds": codemojex.rounds()})
