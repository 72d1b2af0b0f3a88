"""Small built-in conversations for scoring tests (no dependency on the shared datasets)."""

from __future__ import annotations

from sidecar.transcript.model import Message, ToolCall

RESTAURANT = [
    Message("system", "You are a booking assistant for restaurants and taxis."),
    Message("user", "I need a table for two tonight, somewhere quiet near the river."),
    Message("assistant", "Sure, which area of town would you like, and at what time?"),
    Message("user", "The centre please, around 7pm. Can you also book a taxi?"),
    Message("assistant", "", tool_calls=(ToolCall("find_restaurant", '{"people": 2, "area": "centre"}'),)),
    Message("tool", '{"name": "The Riverside", "phone": "01223 356354"}', name="find_restaurant"),
    Message("assistant", "I have booked The Riverside. Your reference number is 7GAWK763."),
    Message("user", "No, that is all, thank you. Goodbye!"),
    Message("assistant", "Have a lovely evening."),
]

TRAVEL = [
    Message("user", "What is the weather like in Cambridge on Friday?"),
    Message("assistant", "It should be dry and mild, around 14 degrees."),
    Message("user", "Please change my flight to the later one and add a checked bag."),
    Message("assistant", "Done: you are on the 18:05 flight with one checked bag."),
    Message("user", "Thanks. Can you also find a hotel with free parking?"),
]

CONVERSATIONS = [RESTAURANT, TRAVEL]

# Two-message conversations: with the tiny model's fixed weights some of these end (the end tag
# is the greedy next token) and some do not, so both verdicts are exercised.
_ASSISTANT_REPLIES = [
    "Sure, which area?",
    "Done.",
    "Your reference number is 7GAWK763.",
    "Is there anything else I can help with?",
    "Have a lovely evening.",
    "It should be dry and mild.",
    "I have booked it.",
    "You are welcome.",
]
SHORT = [[Message("user", "I need a table for two tonight."), Message("assistant", a)] for a in _ASSISTANT_REPLIES]
