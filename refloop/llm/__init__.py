"""Model calls. Importing this package first makes `import openai` skip the API's
thousand type models refloop never uses (refloop.llm.lazy_types)."""

from refloop.llm import lazy_types

lazy_types.install()
