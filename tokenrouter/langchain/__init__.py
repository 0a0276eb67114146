"""LangChain's chat model on the engine: `ChatTokenRouter` (`pip install 'tokenrouter[langchain]'`).

>>> model = ChatTokenRouter(engine=llm, max_tokens=256)  # an LLM; an Engine for async calls only
>>> model.bind_tools([get_weather]).invoke("Weather in Paris?").tool_calls

LangChain's OpenAI chat model over `tokenrouter.openai`'s in-process clients (`chat_model.py`);
`async_only.py` is what refuses a blocking call when only an `Engine` was given.
"""

from .async_only import SyncCallError
from .chat_model import ChatTokenRouter

__all__ = ["ChatTokenRouter", "SyncCallError"]
