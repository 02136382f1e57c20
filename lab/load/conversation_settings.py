"""`lab sweep --turns` / `--think-ms`: conversations on the chat endpoint, defined once (the
click options come from here; lab.load.conversation)."""

from __future__ import annotations

from lab.load.conversation import Conversations
from lab.shared.config_cli import MAX_SECONDS, Settings, setting

MAX_TURNS = 1000


class ConversationSettings(Settings):
    """Multi-turn conversations: each turn sends the history with the previous answer."""

    turns: int = setting(
        1, "Turns per conversation (chat endpoint): each turn sends the history with the "
        "previous answer, and --requests counts conversations. Under --rate, conversations "
        "arrive at the rate and turns follow their predecessor.", ge=1, le=MAX_TURNS)
    think_ms: float = setting(
        0.0, "With --turns: milliseconds between an answer's end and the next turn.", ge=0,
        le=MAX_SECONDS * 1000, metavar="MS")

    def shape(self) -> Conversations:
        return Conversations(self.turns, self.think_ms)
