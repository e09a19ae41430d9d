"""Write the small CoNLL-format demo dataset that ships with ``ner``.

Usage:
    python scripts/make_sample_data.py [OUT_DIR]      # default: ner/sample_data

The data is synthetic and was written for this project: every sentence is
produced from the hand-written news-style templates and name pools below.
No text is copied from any corpus.  Output is deterministic (stdlib only,
``random.Random(1234)``), so re-running the script reproduces the files
byte for byte.

Format: ``word TAG`` per line (IOB2, types PER/ORG/LOC/MISC), a blank line
between sentences, and a leading ``-DOCSTART- O`` line.
"""
import os
import random
import re
import sys

SEED = 1234
SPLITS = [("train", 450), ("valid", 120), ("test", 120)]
HOLDOUT = 0.3    # share of each pool that only valid/test may use
P_UNSEEN = 0.5   # in valid/test, chance that a slot draws an unseen name


def pool(text):
    return [" ".join(s.split()) for s in text.split(",") if s.strip()]


# Entity pools by slot name -> (tag, names).  Subtypes keep templates
# plausible ("the {NAT} government", not "the Nimbus X2 government").
# Deliberate overlaps (Lisbon / Bank of Lisbon / Lisbon Open, Harper /
# Harper Logistics, Jordan / Jordan Ellis) force the model to use context.
POOLS = {
    "PER": ("PER", pool("""
        Anna Kowalski, Rafael Mendes, Kenji Watanabe, Amara Okafor, Lars Henriksen,
        Priya Raman, Tomas Novak, Fatima Haddad, Diego Alvarez, Mei Lin Chen,
        Olusegun Adeyemi, Sofia Russo, Ivan Petrov, Hannah Becker, Mateo Rossi, Aisha Bello,
        Jonas Lindqvist, Chloe Martin, Arjun Mehta, Yuki Tanaka, Samuel Osei, Elena Moreau,
        Pieter de Vries, Grace Mwangi, Luca Bianchi, Nadia Karimi, Oscar Nilsson,
        Ruth Abebe, Marco Ferreira, Ingrid Dahl, Kwame Asante, Leila Nasser, Jordan Ellis,
        Emily Harper, Sean O'Connor, Ana Lucia Torres, Hiroshi Sato, Zanele Dlamini,
        Boris Volkov, Carmen Ortega, Felix Wagner, Thi Lan Nguyen, David Cohen,
        Maria Santos, Ahmed Farouk, Julia Schmidt, Pavel Horak, Isabel Ruiz, Kofi Mensah,
        Laura Jensen, Ravi Kapoor, Erik Solberg, Nina Kovac, Thomas Berger, Chen Wei,
        Omar Saleh, Martina López, Jean-Paul Girard, Dmitri Sokolov, Alice Dubois,
        Rohan Iyer, Kateryna Bondar, Mohammed Al-Rashid, Lucy Fraser, Patrick Doyle,
        João Pereira, José Ramírez, Zoë Clarke, Kowalczyk, Okonkwo, Lindgren, Moreno,
        Yamada, Fischer, Brennan, Santos, Ivanova, Harper, Costa, Nakamura, Abdi""")),
    "COMPANY": ("ORG", pool("""
        Harper Logistics, Bank of Lisbon, Northwind Airlines, Atlas Motors,
        Bluewater Energy, Meridian Holdings, Kestrel Systems, Coastal Freight,
        Pinecrest Foods, Orbis Telecom, Nordia Bank, Vantage Capital Partners,
        Silverline Media, Helix Pharma, Granite Insurance Group, Sunbridge Retail,
        Tarn Mining Corporation, Alder & Finch, Crescent Bay Hotels, Polaris Aerospace,
        Cobalt Software, Marlow Shipping, Cairo Steel Works, Oslo Maritime Bank,
        Fraser & Sons, Okafor Group, Novaro, Brightwave, Valmont Bank, Kite Labs, Zenith,
        Quorum, Tessaly, AeroNord, Medivo""")),
    "CLUB": ("ORG", pool("""
        Redfield United, Riverside Rovers, Lakeshore Athletic, Northgate City,
        Atletico Sierra, Sporting Vale, Madrid Athletic, St. Clair Rangers,
        Westbrook Wanderers, Harbour City FC, Iron Valley Miners, Dynamo Karsk,
        Real Ostrava, Toronto Lynx""")),
    "AGENCY": ("ORG", pool("""
        Ministry of Finance, National Statistics Office, Central Bank, Kenya Tea Board,
        Civil Aviation Authority, Port Authority of Valencia, Competition Commission,
        Tourism Board of Chile""")),
    "INST": ("ORG", pool("""
        World Trade Council, International Rowing Federation, Everhart University,
        Institute of Marine Research, Daily Ledger, Evening Courier""")),
    "PARTY": ("ORG", pool("""
        Green Party, Reform Party, Liberal Union, People's Democratic Alliance,
        National Front for Renewal, Social Democrats""")),
    "CITY": ("LOC", pool("""
        Lisbon, Oslo, Cairo, Madrid, Toronto, Buenos Aires, Rio de Janeiro, São Paulo,
        Hong Kong, Kuala Lumpur, Cape Town, Nairobi, Lagos, Mumbai, Jakarta, Seoul, Vienna,
        Prague, Warsaw, Helsinki, Dublin, Edinburgh, Valencia, Marseille, Hamburg,
        Rotterdam, Gothenburg, Krakow, Istanbul, Tunis, Accra, Addis Ababa, Lima,
        Montevideo, Vancouver, Chicago""")),
    "COUNTRY": ("LOC", pool("""
        Kenya, Jordan, Brazil, Germany, Japan, Nigeria, Poland, South Africa, New Zealand,
        Peru, Chile, Vietnam, Canada, Sri Lanka, Portugal, Egypt, Norway, Ghana""")),
    "REGION": ("LOC", pool("""
        New South Wales, Bavaria, Catalonia, Patagonia, Siberia, Tasmania, Andalusia,
        Quebec, Rhine Valley, Scottish Highlands""")),
    "NAT": ("MISC", pool("""
        German, Brazilian, Japanese, Nigerian, Polish, Kenyan, French, Canadian, Chilean,
        Scottish, Egyptian, Norwegian, Vietnamese, Ghanaian""")),
    "EVENT": ("MISC", pool("""
        World Cup, Olympics, Winter Games, Coastal Marathon, Northern Cup, Harbour Regatta,
        Lisbon Open, Continental Cup, Spring Classic, Asian Champions Trophy,
        Grand Prix of Tunis, Summer Games""")),
    "PROD": ("MISC", pool("""
        Nimbus X2, Orbis One, Falcon 300, PulsePad, Skyline Pro, Aquila, Atlas Voyager,
        Helix-9, Kestrel Mini, Brightwave Note""")),
    "LANG": ("MISC", pool("Spanish, Portuguese, Swahili, Mandarin, Arabic, English")),
}

# Non-entity fillers (always tagged O); a value may span several tokens.
FILLERS = {
    "DAY": lambda r: r.choice("Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()),
    "MONTH": lambda r: r.choice("January March April June July September October December".split()),
    "YEAR": lambda r: str(r.randint(2015, 2024)),
    "NUM": lambda r: str(r.choice([3, 7, 12, 15, 24, 40, 85, 120, 350, 1200])),
    "PCT": lambda r: f"{r.randint(0, 9)}.{r.randint(1, 9)}",
    "SCORE": lambda r: f"{r.randint(1, 4)}-{r.randint(0, 3)}",
    "DATE": lambda r: f"{r.choice(['May', 'August', 'November'])} {r.randint(1, 28)}",
}

# Templates are pre-tokenised: tokens separated by single spaces.
TEMPLATES = [
    # sports
    "{CLUB} beat {CLUB} {SCORE} on {DAY} , with {PER} scoring twice in the second half .",
    "{PER} , who joined {CLUB} from {CLUB} in {MONTH} , was named in the {NAT} squad for the {EVENT} .",
    "{PER} won the {EVENT} in {CITY} , finishing {NUM} seconds ahead of {PER} .",
    "{NAT} sprinter {PER} set a national record at the {EVENT} .",
    "The match in {CITY} was postponed because of heavy rain .",
    "Results of the {EVENT} on {DAY} : {PER} ( {COUNTRY} ) {NUM} points , {PER} ( {COUNTRY} ) {NUM} points .",
    "{PER} ( {CLUB} ) was sent off after {NUM} minutes and will miss the next game .",
    # politics
    "{PER} , leader of the {PARTY} , said on {DAY} that talks with {COUNTRY} would resume next week .",
    "The {AGENCY} said inflation in {COUNTRY} rose to {PCT} percent in {MONTH} .",
    "\" We will not accept these terms , \" {PER} told reporters in {CITY} .",
    "Voters in {REGION} go to the polls on {DAY} in an election seen as a test for the {PARTY} .",
    "The {NAT} foreign minister arrived in {CITY} for two days of talks .",
    "Officials said the agreement would be signed before the end of {MONTH} .",
    "Parliament approved the budget by {NUM} votes to {NUM} .",
    "{PER} said the {NAT} government had no plans to raise taxes .",
    "{NAT} President {PER} met {PER} in {CITY} on {DAY} .",
    "{COUNTRY} 's economy grew {PCT} percent in the third quarter , the {AGENCY} said .",
    # business
    "{PER} , the chief executive of {COMPANY} , said on {DAY} that the company would open an office in {CITY} .",
    "{COMPANY} shares rose {PCT} percent after the company reported higher profits .",
    "{COMPANY} agreed to buy {COMPANY} for {NUM} million dollars , the companies said in a statement .",
    "Shares fell {PCT} percent in early trading on {DAY} .",
    "{COMPANY} will launch the {PROD} in {COUNTRY} in {MONTH} , a spokeswoman said .",
    "Analysts at {COMPANY} expect the {PROD} to sell more than {NUM} million units in its first year .",
    "The {AGENCY} fined {COMPANY} {NUM} million euros for breaching competition rules .",
    "Sales of the {PROD} ( launched in {YEAR} ) have slowed , according to {PER} .",
    "{PER} will step down as chairman of {COMPANY} in {MONTH} {YEAR} .",
    "{COMPANY} said it would cut {NUM} jobs by the end of {YEAR} .",
    "The {EVENT} drew a record crowd on {DAY} despite the cold .",
    "A survey by the {INST} found that {PCT} percent of drivers in {COUNTRY} use a phone .",
    "Oil prices were steady on {DAY} as traders waited for new figures .",
    "{COMPANY} , based in {CITY} , employs about {NUM} people .",
    "The report , written by {PER} of the {INST} , will be published on {DATE} .",
    # travel
    "Flights between {CITY} and {CITY} were cancelled on {DAY} after a strike by airport staff .",
    "Tourist arrivals in {REGION} rose {PCT} percent last year , the {AGENCY} said .",
    "{PER} , a guide in {CITY} , said most visitors now come from {COUNTRY} and speak {LANG} .",
    "The new rail link will cut travel time from {CITY} to {CITY} to {NUM} hours .",
    "Hotel prices in {CITY} doubled during the {EVENT} .",
    "Menus are printed in {LANG} and {LANG} for {NAT} visitors .",
    "Heavy snow closed roads across {REGION} on {DAY} .",
    "Police in {CITY} said {NUM} people were injured when a bus left the road .",
    "{COMPANY} added {NUM} weekly flights to {COUNTRY} , citing strong demand .",
]

# Held back from train so that valid/test also contain unseen phrasings.
EVAL_TEMPLATES = [
    "Speaking in {LANG} , {PER} thanked fans of {CLUB} for their support .",
    "{COMPANY} denied reports that it had held talks with {PER} about a move to {CITY} .",
    "Organisers of the {EVENT} said ticket sales in {COUNTRY} had exceeded expectations .",
    "A spokesman for the {AGENCY} declined to comment on the {PROD} recall .",
    "{PER} , who grew up in {REGION} , now coaches {CLUB} .",
    "Prices for the {PROD} in {CITY} start at {NUM} dollars .",
]

# CoNLL-style wire headlines, rendered in upper case.
HEADLINES = [
    "SOCCER - {CLUB} SACK COACH {PER} .",
    "TENNIS - {PER} BEATS {PER} IN {CITY} .",
    "MARKETS - {COMPANY} FALLS {PCT} PCT IN {CITY} .",
]

SHORT = ["Rain stopped play .", "Traffic was light .", "Talks ended without agreement .",
         "Play resumed at noon ."]

SLOT = re.compile(r"^\{(\w+)\}$")


def split_pools(rng):
    """Per slot: (names train may use, names only valid/test may use)."""
    out = {}
    for name, (tag, names) in POOLS.items():
        names = rng.sample(names, len(names))  # shuffled copy
        k = max(1, round(len(names) * HOLDOUT))
        out[name] = (tag, names[k:], names[:k])
    return out


def pick_entity(rng, pools, slot, split, used):
    tag, seen, unseen = pools[slot]
    cands = seen if split == "train" else (unseen if rng.random() < P_UNSEEN else seen)
    # never repeat a name inside one sentence; fall back to the seen part of the pool
    name = rng.choice([n for n in cands if n not in used] or [n for n in seen if n not in used])
    used.add(name)
    return tag, name


def render(rng, template, pools, split):
    """Fill one template; return a list of (token, tag) pairs."""
    pairs, used = [], set()
    for tok in template.split(" "):
        m = SLOT.match(tok)
        if not m:
            pairs.append((tok, "O"))
        elif m.group(1) in FILLERS:
            pairs += [(w, "O") for w in FILLERS[m.group(1)](rng).split(" ")]
        else:
            etype, name = pick_entity(rng, pools, m.group(1), split, used)
            words = name.split(" ")
            pairs += [(w, ("B-" if i == 0 else "I-") + etype) for i, w in enumerate(words)]
    return pairs


def long_sentence(rng, templates, pools, split):
    """Join clauses with ';' until 40-60 tokens, to exercise windowing."""
    while True:
        pairs = []
        while len(pairs) < 40:
            clause = render(rng, rng.choice(templates), pools, split)
            if pairs and clause[0][1] == "O":  # "The" -> "the" mid-sentence
                clause[0] = (clause[0][0].lower(), "O")
            pairs = pairs[:-1] + [(";", "O")] + clause if pairs else clause
        if len(pairs) <= 60:
            return pairs


def make_split(rng, split, n, pools):
    templates = TEMPLATES + (EVAL_TEMPLATES if split != "train" else [])
    n_short, n_long, n_head = 4 if split == "train" else 3, max(5, n // 25), max(3, n // 40)
    sents = [[(w, "O") for w in s.split(" ")] for s in rng.sample(SHORT, n_short)]
    sents += [long_sentence(rng, templates, pools, split) for _ in range(n_long)]
    for _ in range(n_head):
        sents.append([(w.upper(), t) for w, t in render(rng, rng.choice(HEADLINES), pools, split)])
    while len(sents) < n:
        sents.append(render(rng, rng.choice(templates), pools, split))
    rng.shuffle(sents)
    return sents


def write_conll(path, sents):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("-DOCSTART- O\n\n")
        for sent in sents:
            f.write("".join(f"{w} {t}\n" for w, t in sent) + "\n")


def main(argv):
    out_dir = argv[1] if len(argv) > 1 else os.path.join("ner", "sample_data")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(SEED)
    pools = split_pools(rng)
    for split, n in SPLITS:
        sents = make_split(rng, split, n, pools)
        path = os.path.join(out_dir, split + ".conll")
        write_conll(path, sents)
        print(f"wrote {path} ({len(sents)} sentences)")


if __name__ == "__main__":
    main(sys.argv)
