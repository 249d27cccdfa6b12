"""The built-in text data (`--data world`, `world-hard`): questions about the residents of an invented world,
answered by one passage each.

Each resident has a made-up name, a home town (invented names), a profession and a pastime. The passage states
them plainly ("Orvel Daskin is a dentist in Quillby who keeps bees in his spare time."); the query never names
the resident and paraphrases the profession and the pastime ("Which Quillby resident takes care of people's teeth
and is a beekeeper?"), so retrieval must map descriptions to the words of the passage: a pretrained sentence
encoder does that in part, and fine-tuning on the training residents teaches it the rest for held-out residents,
whose towns, professions and pastimes are the same vocabulary in new combinations.

Hard negatives are passages about invented residents who share two attributes with the query's resident and
differ in the third, always in a combination no resident of the world has, so no hard negative answers any query.
Deterministic given the seed.

`hard=True` (the built-in `world-hard`) makes the passages confusable: each also tells of a relative of the
resident, with two attributes of their own drawn from the same vocabulary ("Her cousin, a pilot, lives in
Velmora."), before or after the resident's sentence. So most passages share words with many queries whose answer
they are not, and retrieval must bind each attribute to its person. A relative never has all three attributes
stated, so still no passage but its positive answers a query. `hard=False` draws no relative: the default
world's rows depend on its seed alone.
"""
from __future__ import annotations

import random

from gradcache.train.data.text.text_pairs import TextPairs

BUILT_IN_TEXT = "world"
BUILT_IN_HARD = "world-hard"  # the same world, every passage also telling of a relative: confusable passages
TOWNS = ["Velmora", "Quillby", "Ostrand", "Harrowgate", "Penmarch", "Duskwater", "Brindlefen", "Caldmere",
         "Yarrowick", "Thornsby", "Elderholm", "Mirefield", "Saltcombe", "Rookhaven", "Ashcliff", "Fennimore",
         "Glenhurst", "Wyncroft", "Lindqvay", "Bramblest"]
# profession: (the passage's word, the query's descriptions)
PROFESSIONS = {
    "baker": ["bakes bread for a living", "runs the bakery"],
    "carpenter": ["works with wood", "builds furniture by hand"],
    "dentist": ["takes care of people's teeth", "fixes teeth"],
    "nurse": ["looks after patients in the hospital", "cares for the sick on the ward"],
    "pilot": ["flies aeroplanes", "is at the controls of passenger jets"],
    "plumber": ["repairs leaking pipes", "fixes taps and drains"],
    "librarian": ["looks after the books of the library", "lends books to readers"],
    "chef": ["cooks in a restaurant kitchen", "prepares meals for diners"],
    "farmer": ["grows crops and raises cattle", "works the fields"],
    "teacher": ["teaches children at the school", "gives lessons in a classroom"],
    "firefighter": ["puts out fires", "rescues people from burning houses"],
    "architect": ["designs buildings", "draws plans for houses"],
    "tailor": ["sews clothes to measure", "makes suits"],
    "mechanic": ["repairs cars", "fixes engines in a garage"],
    "electrician": ["installs wiring", "repairs electrical circuits"],
    "veterinarian": ["treats sick animals", "is an animal doctor"],
}
# pastime: (the passage's phrase, the query's descriptions)
PASTIMES = {
    "plays the violin": ["makes music with a bow and strings", "is a violinist"],
    "collects stamps": ["keeps albums of postage stamps", "is a philatelist"],
    "climbs mountains": ["goes up high peaks", "is a mountaineer"],
    "grows orchids": ["raises exotic flowers", "tends tropical blooms"],
    "plays chess": ["enjoys a board game of kings and pawns", "is a chess player"],
    "keeps bees": ["is a beekeeper", "looks after hives for honey"],
    "watches birds": ["is a birdwatcher", "observes wild birds with binoculars"],
    "rides horses": ["goes horseback riding", "is an equestrian"],
    "sails boats": ["goes sailing", "takes a yacht out on the water"],
    "writes poetry": ["composes poems", "is a poet"],
    "plays the drums": ["is a drummer", "plays percussion"],
    "paints landscapes": ["paints pictures of the countryside", "makes paintings of scenery"],
    "runs marathons": ["does long-distance running", "is a marathon runner"],
    "knits scarves": ["does knitting with wool", "makes woollen scarves"],
}
PASSAGES = [
    "{name} is {article} {profession} in {town} who {pastime} in {their} spare time.",
    "{name}, {article} {profession} from {town}, {pastime} at weekends.",
    "In {town}, {name} works as {article} {profession} and {pastime}.",
    "{name} lives in {town}. {They} is {article} {profession} and {pastime}.",
]
QUERIES = [
    "Which {town} resident {profession} and {pastime}?",
    "who in {town} {profession} and also {pastime}?",
    "someone from {town} who {pastime} and {profession}",
    "Looking for the person who {profession}, lives in {town} and {pastime}.",
    "the {town} local that {pastime} and {profession}",
]
SYLLABLES = ["al", "bren", "cor", "dask", "el", "fen", "gar", "hol", "is", "jor", "kel", "lin", "mar", "nor",
             "or", "pel", "quin", "ros", "sel", "tam", "ul", "vor", "wen", "yas", "zel"]
PRONOUNS = [("his", "He"), ("her", "She")]
RELATIVES = ["sister", "brother", "cousin", "aunt", "uncle", "son", "daughter", "best friend"]
# a relative's two attributes: (town, profession), (profession, pastime) or (town, pastime), never all three
RELATIVE_SENTENCES = [
    "{Their} {relative}, {article} {profession}, lives in {town}.",
    "{Their} {relative} is {article} {profession} abroad and {pastime}.",
    "{Their} {relative} in {town} {pastime}.",
]


def _name(draw: random.Random) -> str:
    return " ".join("".join(draw.choice(SYLLABLES) for _ in range(draw.randint(2, 3))).capitalize()
                    for _ in range(2))


def _article(profession: str) -> str:
    return "an" if profession[0] in "aeiou" else "a"


def _passage(draw: random.Random, town: str, profession: str, pastime: str, hard: bool = False) -> str:
    their, they = draw.choice(PRONOUNS)
    text = draw.choice(PASSAGES).format(name=_name(draw), town=town, profession=profession, pastime=pastime,
                                        article=_article(profession), their=their, They=they)
    if not hard:
        return text
    relative = draw.choice(list(PROFESSIONS))
    other = draw.choice(RELATIVE_SENTENCES).format(
        Their=their.capitalize(), relative=draw.choice(RELATIVES), article=_article(relative), profession=relative,
        town=draw.choice(TOWNS), pastime=draw.choice(list(PASTIMES)))
    return f"{other} {text}" if draw.random() < 0.5 else f"{text} {other}"


def generate_world(rows: int = 4000, negatives_per_query: int = 1, seed: int = 0, hard: bool = False) -> TextPairs:
    """`rows` residents with distinct (town, profession, pastime) and their queries, hard negatives and passages;
    `hard`: every passage also tells of a relative with two attributes of the same vocabulary (the module's text).

    Raises:
        ValueError: more rows than distinct attribute combinations leave room for, or negatives_per_query < 0.
    """
    attributes = {"town": TOWNS, "profession": list(PROFESSIONS), "pastime": list(PASTIMES)}
    combinations = len(TOWNS) * len(PROFESSIONS) * len(PASTIMES)
    if negatives_per_query < 0 or not 0 < rows * (1 + negatives_per_query) <= combinations * 3 // 4:
        raise ValueError(f"generate_world needs negatives_per_query >= 0 and 0 < rows * (1 + negatives_per_query) "
                         f"<= {combinations * 3 // 4} (three quarters of the {combinations} attribute combinations, "
                         f"so free ones remain for hard negatives), got rows={rows}, "
                         f"negatives_per_query={negatives_per_query}")
    draw = random.Random(seed)
    every = [(t, p, h) for t in TOWNS for p in PROFESSIONS for h in PASTIMES]
    residents = draw.sample(every, rows)
    taken = set(residents)
    pairs = TextPairs([], [], [])
    for town, profession, pastime in residents:
        resident = {"town": town, "profession": profession, "pastime": pastime}
        words = {"town": town, "profession": draw.choice(PROFESSIONS[profession]),
                 "pastime": draw.choice(PASTIMES[pastime])}
        pairs.queries.append(draw.choice(QUERIES).format(**words))
        pairs.positives.append(_passage(draw, town, profession, pastime, hard))
        negatives = []
        while len(negatives) < negatives_per_query:  # ends: >= 1/4 of all combinations stay free
            key = draw.choice(list(attributes))
            changed = dict(resident, **{key: draw.choice(attributes[key])})
            combination = (changed["town"], changed["profession"], changed["pastime"])
            if combination not in taken:
                taken.add(combination)
                negatives.append(_passage(draw, *combination, hard))
        pairs.negatives.append(negatives)
    return pairs
