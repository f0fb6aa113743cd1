"""Training text: local corpora only (no hubs), split deterministically into train and held-out.

Sources (see docs/drafter.md for licences):
  * Debian `python3.11-doc` and `linux-doc-6.1`: reStructuredText sources of the Python and Linux docs
    (`fetch_debian_docs` downloads the .deb files with apt and unpacks them; nothing is installed);
  * the Python standard library source of the running interpreter (code);
  * regenerated chat: the target's own answers to prompts built from topic lists (`chat_prompts`);
  * regenerated everyday answers: the target's own answers to everyday questions (`everyday_prompts`).
"""

from __future__ import annotations

import hashlib
import subprocess
import sysconfig
from pathlib import Path
from typing import Iterator, NamedTuple

from edge_spec.errors import ConfigError

DEBIAN_PACKAGES = ("python3.11-doc", "linux-doc-6.1")
TEXT_SUFFIXES = (".rst.txt", ".txt", ".rst", ".md", ".py")
HELD_OUT_PERCENT = 5


class Document(NamedTuple):
    path: str
    kind: str  # "docs" | "code" | "chat"
    text: str


def is_held_out(key: str, percent: int = HELD_OUT_PERCENT) -> bool:
    """Deterministic split by a hash of the file path / prompt: never trained on, used for evaluation."""
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < percent


def fetch_debian_docs(cache: Path) -> list[Path]:
    """Download and unpack the Debian doc packages into `cache` (apt-get download + dpkg-deb -x)."""
    roots = []
    for package in DEBIAN_PACKAGES:
        root = cache / package
        if not (root / ".complete").exists():
            root.mkdir(parents=True, exist_ok=True)
            try:
                subprocess.run(["apt-get", "download", package], cwd=root, check=True, capture_output=True)
                deb = next(root.glob("*.deb"))
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root / "files")], check=True, capture_output=True)
                deb.unlink()
            except (OSError, subprocess.CalledProcessError, StopIteration) as err:
                raise ConfigError(f"could not fetch Debian package {package}: {err}",
                                  "run on Debian/Ubuntu with apt, or pass --data with your own text folders") from err
            (root / ".complete").touch()
        roots.append(root / "files")
    return roots


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _kind(path: Path) -> str:
    return "code" if path.suffix == ".py" else "docs"


PIECE_CHARS = 4000  # a text file given by itself is cut into documents of about this size


def file_pieces(path: Path, piece_chars: int = PIECE_CHARS) -> Iterator[str]:
    """A text file given by itself (`--data corpus.txt`, any size) as consecutive pieces of at least `piece_chars`
    characters, cut at the first blank line after that (at a line end past twice that, for text without blank
    lines); read line by line."""
    lines: list[str] = []
    size = 0
    with path.open(errors="ignore") as f:
        for line in f:
            lines.append(line)
            size += len(line)
            if size >= piece_chars and (not line.strip() or size >= 2 * piece_chars):
                yield "".join(lines)
                lines, size = [], 0
    if lines:
        yield "".join(lines)


def iter_documents(roots: list[Path], *, held_out: bool, min_chars: int = 200,
                   max_bytes: int = 400_000) -> Iterator[Document]:
    """Text files under `roots` (sorted, so every run sees the same order), train or held-out part. A root that is a
    file is a corpus by itself: its pieces (`file_pieces`) are the documents, split into train and held-out."""
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise ConfigError(f"data path {root} does not exist", "pass existing files or folders to --data")
        if root.is_file():
            for i, text in enumerate(file_pieces(root)):
                if is_held_out(f"{root.name}#{i}") == held_out and len(text) >= min_chars:
                    yield Document(f"{root}#{i}", _kind(root), text)
            continue
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES)
                       and "test" not in p.parts and "site-packages" not in p.parts)
        for path in files:
            if is_held_out(str(path.relative_to(root))) != held_out:
                continue
            if path.stat().st_size > max_bytes:
                continue
            text = path.read_text(errors="ignore")
            if len(text) >= min_chars:
                yield Document(str(path), _kind(path), text)


# ---- chat prompts (for regenerated data and for the chat evaluation set) ------------------------------
_TEMPLATES = (
    "Explain what the Python module `{topic}` is used for, with a short example.",
    "Write a small Python function that uses `{topic}` and explain how it works.",
    "What are common mistakes when using `{topic}` in Python?",
    "Summarise the key ideas of {topic} in a few sentences.",
    "How would you explain {topic} to a beginner?",
    "Give three practical tips about {topic}.",
    "Compare {topic} with an alternative and say when to use each.",
    "Write a step-by-step guide about {topic}.",
)
_GENERAL_TOPICS = (
    "recursion", "hash tables", "binary search", "unit testing", "version control with git", "regular expressions",
    "HTTP requests", "JSON parsing", "file permissions on Linux", "memory management", "virtual environments",
    "sorting algorithms", "exceptions", "list comprehensions", "decorators", "generators", "type hints",
    "the Linux scheduler", "device drivers", "interrupt handling", "page tables", "system calls", "shell scripting",
    "SQL joins", "caching", "concurrency", "threads and processes", "sockets", "command-line arguments",
    "logging", "dates and time zones", "floating-point numbers", "Unicode text", "data classes", "iterators",
    "the Python GIL", "big-O notation", "linked lists", "graphs", "dynamic programming", "code review",
    "writing documentation", "healthy sleep", "learning a language", "planning a trip", "saving money",
    "photosynthesis", "the water cycle", "climate change", "the solar system", "the French Revolution",
)


def chat_prompts(extra_topics: list[str], *, held_out: bool, templates_per_topic: int = 2) -> list[str]:
    """Prompts = templates x topics (stdlib module names + general topics), split by topic hash.

    Topic i uses templates i, i+3, i+6, ... (mod 8); the first two are the same for any `templates_per_topic`."""
    if not 1 <= templates_per_topic <= len(_TEMPLATES):
        raise ConfigError(f"templates per topic must be 1..{len(_TEMPLATES)}, got {templates_per_topic}")
    prompts = []
    for i, topic in enumerate(sorted(set(_GENERAL_TOPICS) | set(extra_topics))):
        for template in (_TEMPLATES[(i + 3 * j) % len(_TEMPLATES)] for j in range(templates_per_topic)):
            prompt = template.format(topic=topic)
            if is_held_out(topic, 10) == held_out:  # split by topic: held-out topics are never seen
                prompts.append(prompt)
    return prompts


# everyday questions (the `everyday` source): what a phone assistant is asked, not programming
_EVERYDAY_TEMPLATES = (
    "How do I get started with {topic}?",
    "Give me three practical tips for {topic}.",
    "What are the most common mistakes people make with {topic}?",
    "Explain {topic} to a friend who has never thought about it.",
    "Write a short, friendly paragraph about {topic}.",
    "What should I know about {topic} before I begin?",
    "I want to get better at {topic}. Where should I start?",
    "Can you give me a simple plan for {topic}?",
    "What do beginners usually get wrong about {topic}?",
    "Summarize the basics of {topic} in a few sentences.",
)
_EVERYDAY_TOPICS = (
    "cooking pasta", "baking bread", "meal planning for a week", "keeping houseplants alive", "growing tomatoes",
    "running a first 5k", "stretching after exercise", "drinking enough water", "sleeping better",
    "managing stress", "meditation", "job interviews", "writing a cover letter", "asking for a raise",
    "working from home", "time management", "saving for a holiday", "making a monthly budget", "paying off debt",
    "buying a used car", "cycling to work", "learning to swim", "learning the guitar", "learning Spanish",
    "reading more books", "keeping a journal", "taking better photos with a phone", "planning a birthday party",
    "hosting a dinner", "moving to a new city", "renting a first apartment", "cleaning a kitchen",
    "doing laundry", "removing stains", "training a puppy", "caring for a cat", "camping in the mountains",
    "packing for a flight", "travelling by train in Europe", "visiting Japan", "staying safe in the sun",
    "treating a cold", "first aid for small cuts", "talking to a teenager", "making friends as an adult",
    "writing a thank-you note", "giving a short speech", "preparing for an exam", "choosing a laptop",
    "protecting passwords", "recycling at home", "saving energy at home", "composting", "bird watching",
    "making coffee at home", "brewing tea", "planning a road trip", "volunteering", "decluttering a wardrobe",
    # grown 2026-12-06 (issue #44): more of what a phone assistant is asked; none near a held-out topic
    "making soup", "grilling vegetables", "eating more vegetables", "cutting down on sugar", "packing a lunch",
    "baking cookies", "making a smoothie", "storing leftovers safely", "shopping for groceries on a budget",
    "cooking for one person", "hosting a picnic", "making pancakes", "choosing a ripe avocado", "making salad dressing",
    "starting a vegetable garden", "mowing the lawn", "painting a room", "hanging a picture", "fixing a leaky tap",
    "unclogging a drain", "organizing a garage", "decorating a small bedroom", "choosing a mattress",
    "keeping a home warm in winter", "keeping cool in a heatwave", "preparing for a power cut", "babyproofing a home",
    "walking every day", "starting yoga", "lifting weights safely", "improving posture", "staying active at a desk job",
    "hiking with children", "going for a bike ride", "playing tennis", "joining a gym", "training for a half marathon",
    "quitting caffeine", "eating breakfast", "reducing screen time", "waking up earlier", "taking a nap",
    "dealing with a headache", "preventing back pain", "visiting a dentist", "wearing sunscreen",
    "washing hands properly", "staying healthy while travelling", "building a morning routine", "setting goals",
    "sticking to a new habit", "dealing with procrastination", "staying focused while studying", "taking notes in class",
    "learning to code", "learning to draw", "learning to knit", "learning to play chess", "learning to dance",
    "learning to sing", "learning to play the piano", "learning French", "learning sign language",
    "memorizing vocabulary", "writing a short story", "starting a blog", "writing a poem", "reading to children",
    "choosing a book club book", "starting a podcast", "editing videos on a phone", "making a photo album",
    "writing an email to a landlord", "writing a complaint letter", "writing a birthday card", "asking for feedback",
    "preparing for a performance review", "negotiating a salary", "changing careers", "starting a small business",
    "selling things online", "running a garage sale", "working in a team", "leading a meeting", "managing an inbox",
    "using a calendar", "taking a day off", "setting up a home office", "commuting by bus", "learning to drive",
    "parking in a tight space", "washing a car", "checking tyre pressure", "riding a scooter safely",
    "flying with a baby", "choosing a hotel", "booking cheap flights", "travelling alone", "visiting Italy",
    "visiting New York", "going on a beach holiday", "going skiing for the first time", "planning a wedding",
    "buying a gift for a friend", "throwing a surprise party", "celebrating a new year", "planning a family reunion",
    "keeping in touch with old friends", "apologizing to a friend", "handling a disagreement", "meeting new neighbours",
    "going on a first date", "supporting a grieving friend", "helping an elderly parent", "teaching a child to ride a bike",
    "helping with homework", "choosing a school", "raising a toddler", "potty training", "getting a baby to sleep",
    "adopting a rescue dog", "keeping a goldfish", "caring for a rabbit", "walking a dog in the rain",
    "feeding a kitten", "choosing a pet", "saving for retirement", "opening a savings account", "using a credit card wisely",
    "avoiding online scams", "filing taxes", "buying a first home", "comparing phone plans", "cancelling subscriptions",
    "splitting bills with roommates", "living with roommates", "keeping a tidy home", "ironing a shirt",
    "folding clothes", "sewing a button", "choosing running shoes", "dressing for a job interview", "caring for leather shoes",
    "backing up a phone", "setting up a new phone", "speeding up a slow computer", "using a spreadsheet",
    "video calling family", "reducing food waste", "using less plastic", "saving water", "picking up litter",
    "watching the stars", "visiting a museum", "going to a concert", "fishing", "kayaking", "building a campfire",
    "making a snowman", "flying a kite", "doing a jigsaw puzzle", "starting a collection",
)


def everyday_prompts(*, held_out: bool) -> list[str]:
    """Everyday questions: every template x every topic, split by topic hash like `chat_prompts`."""
    return [t.format(topic=topic) for topic in sorted(_EVERYDAY_TOPICS) if is_held_out(topic, 10) == held_out
            for t in _EVERYDAY_TEMPLATES]


def stdlib_module_names() -> list[str]:
    root = stdlib_root()
    return sorted(p.stem for p in root.glob("*.py") if not p.stem.startswith("_"))


def prefix(text: str, chars: int = 600) -> str:
    """A prompt-sized opening of a document, cut at a line end, skipping blank lead-in."""
    text = text.lstrip()
    cut = text.rfind("\n", 0, chars)
    return text[:cut if cut > chars // 3 else chars]
