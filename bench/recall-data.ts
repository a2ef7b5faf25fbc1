/**
 * The conversational data set of `npm run bench:recall`, generated in code from a seed (no
 * downloads, same output on every run).
 *
 * Four multi-session dialogues between two people, January to August 2025, LoCoMo-style: small
 * talk and filler between the facts, facts worded in several ways (one wording picked per run of
 * the generator, by the seed), facts spread over two adjacent turns (a question, then an answer
 * that does not repeat the question's words), facts that change over time, and names and places
 * that recur across dialogues (there are two Mayas, two Sams, three Ineses and two Toms). Each
 * question lists the turns that answer it; a temporal question is answered by the date of its
 * turn, which is the date of the daily log the turn is written to.
 *
 * `fillerDays` makes more of the same (other speakers, earlier years) for the latency part.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export type Kind = 'single-hop' | 'multi-hop' | 'temporal' | 'open-ended';
export const KINDS: readonly Kind[] = ['single-hop', 'multi-hop', 'temporal', 'open-ended'];

export interface Turn {
  /** `d1-s03-t12`: dialogue, session, turn. */
  id: string;
  dialogue: string;
  session: number;
  speaker: string;
  /** `YYYY-MM-DD` */
  date: string;
  /** `HH:MM` */
  time: string;
  /** `YYYY-MM-DDTHH:MM` (local time of the conversation) */
  timestamp: string;
  text: string;
}

export interface Session {
  dialogue: string;
  index: number;
  date: string;
  speakers: readonly [string, string];
  turns: Turn[];
}

export interface Question {
  id: string;
  kind: Kind;
  dialogue: string;
  question: string;
  /** What a person would answer (for reading the output; the benchmark scores turns, not words). */
  answer: string;
  /** Ids of the turns that hold the answer. */
  evidence: string[];
}

export interface RecallData {
  sessions: Session[];
  turns: Turn[];
  questions: Question[];
}

// ---------------------------------------------------------------------------------------------
// Seeded randomness

export interface Rand {
  (): number;
  int(lo: number, hi: number): number;
  pick<T>(xs: readonly T[]): T;
  chance(p: number): boolean;
}

/** mulberry32: small, fast, and the same sequence everywhere for a given seed. */
export function prng(seed: number): Rand {
  let a = seed >>> 0;
  const next = (() => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }) as Rand;
  next.int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  next.pick = (xs) => xs[Math.floor(next() * xs.length)]!;
  next.chance = (p) => next() < p;
  return next;
}

// ---------------------------------------------------------------------------------------------
// Small talk: what people say between the things worth remembering

/** People mentioned in passing; none of them is a main character of the data set. */
const MENTIONED = [
  'Dave',
  'Aisha',
  'Rob',
  'Karen',
  'Mei',
  'Gareth',
  'Fatima',
  'Chris',
  'Olga',
  'Pete',
  'Ruth',
  'Declan',
  'Zara',
  'Hamid',
  'Beth',
  'Kwame',
  'Siobhan',
  'Marek',
  'Lucy',
  'Raj',
];
const PLACES = [
  'Lisbon',
  'Porto',
  'Seville',
  'Berlin',
  'Cornwall',
  'the Lake District',
  'Barcelona',
  'Edinburgh',
  'Glasgow',
  'Bath',
  'Utrecht',
  'Galway',
  'Copenhagen',
  'Crete',
  'Madeira',
  'Leeds',
  'Bristol',
  'Manchester',
];
const FOODS = [
  'a Thai green curry',
  'lasagne',
  'mushroom risotto',
  'fish tacos',
  'a chickpea stew',
  'ramen',
  "shepherd's pie",
  'pancakes',
  'a lemon drizzle cake',
  'dumplings',
  'a veggie chilli',
  'roast chicken',
  'leek and potato soup',
  'a massive fry-up',
];
const SHOWS = [
  'The Bear',
  'Slow Horses',
  'Severance',
  'the baking show',
  'the new Attenborough series',
  'Only Murders in the Building',
  'Shrinking',
  'that Danish crime drama',
  'Taskmaster',
  'the Scandi thriller everyone is talking about',
];
const BOOKS = [
  'the new Sally Rooney',
  'a thriller I found at the station',
  'Project Hail Mary',
  'a book about octopuses',
  'Demon Copperhead',
  'some very trashy romance',
  'a biography of Bowie',
];
const WEATHER = [
  "it hasn't stopped raining since Tuesday",
  "it's absolutely freezing",
  "it's weirdly warm for the time of year",
  'the wind nearly took my umbrella',
  "it's gloriously sunny for once",
  'we had hail this morning',
  "it's grey and drizzly, as usual",
];
const ACTIVITIES = [
  'a long walk',
  'a lie-in and nothing else',
  'the car boot sale',
  'a pub quiz',
  'a barbecue if the weather holds',
  'board games at a friend’s',
  'tidying the garden',
  'a trip to the tip',
  'the farmers market',
  'a film marathon',
];
const EVENINGS = [
  'Leftovers and telly',
  'Early night, I’m shattered',
  'Pub quiz with the usual lot',
  'Trying a new recipe',
  'Laundry, living the dream',
  'Catching up with my mum on the phone',
];
const WORK = [
  'Back-to-back meetings all day.',
  'The printer is broken again.',
  'Deadline on Friday, nobody is ready.',
  'Half the team is off sick.',
  'Our IT system crashed twice.',
  'Lots of emails, not much progress.',
];
const BAKES = ['brownies', 'a carrot cake', 'cinnamon buns', 'flapjacks', 'a whole tray of cookies'];
const MUSIC = ['old Motown', 'the Arctic Monkeys', 'a jazz playlist', 'Taylor Swift, no shame', 'Radio 6'];
const ROOMS = ['hallway', 'bathroom', 'spare room', 'kitchen', 'bedroom'];
const CHORES = ['laundry pile', 'ironing', 'garden', 'inbox', 'washing up'];
const DAYS = ['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Sunday'];
const TEAMS = ['United', 'City', 'Leeds', 'Rovers', 'the Irish rugby team', 'England'];
const PETS = ['puppy', 'kitten', 'rabbit', 'greyhound', 'tortoise', 'budgie', 'guinea pig'];
const PET_NAMES = [
  'Biscuit',
  'Pepper',
  'Mango',
  'Pickle',
  'Luna',
  'Milo',
  'Bella',
  'Teddy',
  'Olive',
  'Bruno',
  'Nala',
  'Poppy',
  'Waffles',
];
const HOBBIES = [
  'salsa',
  'pottery',
  'guitar',
  'French',
  'climbing',
  'cello',
  'piano',
  'life drawing',
  'tennis',
  'sewing',
  'kickboxing',
];

type Slots = Record<string, readonly string[]>;
const SLOTS: Slots = {
  name: MENTIONED,
  place: PLACES,
  food: FOODS,
  show: SHOWS,
  book: BOOKS,
  weather: WEATHER,
  activity: ACTIVITIES,
  evening: EVENINGS,
  work: WORK,
  bake: BAKES,
  music: MUSIC,
  room: ROOMS,
  chore: CHORES,
  day: DAYS,
  team: TEAMS,
  pet: PETS,
  petname: PET_NAMES,
  hobby: HOBBIES,
  month: ['March', 'May', 'June', 'September', 'October', 'the spring', 'the autumn'],
  company: [
    'a start-up in town',
    'the council',
    'the university',
    'a big accountancy firm',
    'the hospital',
    'an architecture firm',
    'a games studio',
  ],
  baby: ['a boy', 'a girl'],
  babyname: ['Noah', 'Ava', 'Finn', 'Isla', 'Theo', 'Freya', 'Arlo', 'Rosie'],
  race: ['5k', '10k', 'parkrun', 'half marathon', 'triathlon'],
  part: ['wrist', 'ankle', 'toe', 'finger', 'collarbone'],
  exam: ['driving', 'accountancy', 'grade 3 piano', 'first aid', 'Spanish'],
};

/** Fills `{slot}`s from the pools above (a line starts with a capital letter). */
function fill(r: Rand, text: string): string {
  const out = text.replace(/\{(\w+)\}/g, (_, k: string) => r.pick(SLOTS[k] ?? [k]));
  return out.charAt(0).toUpperCase() + out.slice(1);
}

/** Exchanges of small talk; lines alternate between the two speakers, whoever starts. */
const SMALL_TALK: readonly (readonly string[])[] = [
  ["How's your week going?", 'Long. {work} But surviving.', 'Hang in there.'],
  ['What did you have for dinner?', '{food}, made way too much of it.', 'Send leftovers.'],
  ['Have you watched {show} yet?', "Two episodes in, I'm hooked.", 'No spoilers please!'],
  ['The weather here is grim, {weather}.', 'Same here honestly.', 'Roll on summer.'],
  ['Any plans for the weekend?', 'Not much, maybe {activity}.', 'Sounds perfect to me.'],
  ["I'm so tired today.", 'Bad night?', 'The neighbours had a party until 2am.'],
  ['Did you see the match last night?', "{team} were awful, don't talk to me about it.", 'Ha, fair enough.'],
  [
    '{name} from work brought in {bake} today.',
    'Lucky you, our office only has sad biscuits.',
    'I had three. No regrets.',
  ],
  [
    'My laptop decided to update itself in the middle of a call.',
    'Classic.',
    'I was frozen mid-sentence for a full minute.',
  ],
  ['Read anything good lately?', 'Just finished {book}, really enjoyed it.', 'Adding it to my list.'],
  ['brb, kettle', 'ok', 'Back. Where were we?'],
  [
    'Do you remember {name} from school?',
    'Vaguely, why?',
    'Bumped into them in the supermarket, they have three kids now!',
  ],
  ['I need a holiday.', 'Where would you go?', 'Somewhere warm. {place} maybe.'],
  ['{name} just got back from {place}.', 'Jealous. Was it nice?', 'Apparently it rained the whole time.'],
  ['Traffic was a nightmare this morning.', 'Roadworks again?', 'Always.'],
  ["I've been trying to drink more water.", "How's that going?", 'Mostly I just go to the toilet more.'],
  ['Did you get my voice note?', "Yes, sorry, haven't listened yet.", "It's mostly me complaining, no rush."],
  ['I finally cleaned out the fridge.', 'Brave.', 'There was a yoghurt from October in there.'],
  ['What are you up to tonight?', '{evening}.', 'Nice, enjoy.'],
  ['My mum called, she wants to know when I’m visiting.', 'Classic mum.', "She's already planning the menu."],
  ['The new café on the corner finally opened.', 'Any good?', 'Great coffee, tiny tables.'],
  ["I'm thinking of repainting the {room}.", 'What colour?', 'Some kind of green. Pinterest has ruined me.'],
  ['Phone on 3%, I might vanish.', 'Go charge it!', 'Found a cable, crisis averted.'],
  ['Sorry, was on a call.', 'No worries.'],
  [
    'Have you booked anything for the summer?',
    'Not yet, still arguing about dates.',
    "Don't leave it too late, the prices go mad.",
  ],
  ['Guess who I saw in town today.', 'Who?', "{name}! I haven't seen them in years."],
  ['The {chore} is winning.', 'It always does.', "One day I'll be an adult who has it under control."],
  ["Sorry, I'm rambling.", 'Not at all, I like it.'],
  ['I tried that place you mentioned, the one that does {food}.', 'And??', 'You were right, it was amazing.'],
  ['Is it just me or is this week lasting forever?', "It's not just you.", 'How is it only {day}?'],
  ['I got a parking ticket.', 'Noooo.', 'Twelve minutes over. Twelve!'],
  ['Listening to {music} while I cook.', 'Good choice.', 'Dancing badly too.'],
  ['We should do a proper call soon.', 'Yes! {day} evening?', 'Works for me.'],
  ['haha', 'I know, right'],
  ['lol', 'Honestly though.'],
  ['That reminds me, I still owe you a coffee.', 'You owe me about six coffees.', 'Fair.'],
  ['Ugh, my train is delayed again.', 'How long?', 'Forty minutes and counting.'],
  ['{name} is organising a leaving do on Friday.', 'Are you going?', 'Probably, for one drink. Famous last words.'],
  ["I've got a cold, my voice sounds like a frog.", 'Lemsip and bed.', 'Yes, doctor.'],
  ["The neighbour's cat keeps coming in through our window.", 'Adopt it.', "It's basically adopted us already."],
  ['Went to the dentist today.', 'Fun?', 'Two fillings. I can’t feel my face.'],
  ['My sister keeps sending me videos of her garden.', 'Is it nice?', "It's better than mine, which is the problem."],
  ['Quick question, do you still have my Tupperware?', 'Possibly. Probably.', 'It’s been a year!'],
  ['I made {food} last night and it actually worked.', 'Proud of you.', "Don't get used to it."],
  ["Can't believe it's already {day}.", 'Where does the time go?'],
  [
    'So how are things with you, really?',
    'Honestly, pretty good. A bit busy.',
    'Good busy or bad busy?',
    'Mostly good busy.',
  ],
  ['{name} asked after you, by the way.', 'Aw, say hi from me.'],
  ['The supermarket had no eggs again.', 'What is going on with eggs?', 'No idea. Chaos.'],
  ['Tried to go for a walk, got soaked.', "That's the spirit.", 'Never again. Until tomorrow.'],
  ['I bought a plant. It’s already dying.', 'Too much water?', 'I genuinely don’t know what it wants.'],
  ['Have you heard from {name} recently?', 'Not for ages, you?', 'Same. I should text them.'],
  ["We're having {food} tonight, the kitchen smells amazing.", 'Save me some.'],
  ['Did you ever fix that leaky tap?', 'I watched a video about it.', 'So no.', 'So no.'],
  ['What are you reading at the moment?', '{book}.', 'Any good?', "Ask me when I've finished it."],
  ['My knees are not happy after that walk.', 'Getting old.', 'Rude. Accurate, but rude.'],
  [
    '{name} from upstairs started {hobby} lessons, I can hear every note through the floor.',
    'Oh no.',
    'It’s improving. Slowly.',
  ],
  ['{name} at work just adopted a {pet}, she shows everyone photos.', 'Cute though?', 'Very cute, I have to admit.'],
  ['{name} is moving to {place}, apparently.', 'Wow, big move.', 'I know, the office will be very quiet.'],
  ["{name}'s sister had {baby} last week.", 'Lovely, send them my love.'],
  ['Spent the afternoon on hold to the bank.', 'Did you get anywhere?', 'They cut me off after an hour.'],
  ["I've started doing crosswords on the bus.", 'Any good at them?', 'I finish about a third. Progress.'],
  ['It was {name}’s birthday, we had cake at lunch.', 'What kind?', 'Chocolate, obviously.'],
];

const GREETINGS: readonly (readonly string[])[] = [
  ['Hey! You around?', 'Hey, yes, just made a cup of tea.'],
  ['Hiya, got a minute?', 'Always for you.'],
  ['Are you free for a chat?', 'Yes, perfect timing, I just sat down.'],
  ['Hello stranger!', 'Ha, hello! Sorry I’ve been rubbish at replying.'],
  ['Hey, how are things?', 'Hey you! All fine here, how are you?'],
];
const MORNING_GREETINGS: readonly (readonly string[])[] = [
  ['Morning!', 'Morning! How are you?', 'Good, good. You?', 'Not bad at all.'],
  ['Morning, are you up?', 'Barely. Coffee in hand.'],
];
const EVENING_GREETINGS: readonly (readonly string[])[] = [
  ['Evening! How are things?', 'Hey you! All fine here, how are you?'],
  ['Hey, how was your day?', 'Long! Yours?', 'Same, honestly.'],
];

const GOODBYES: readonly (readonly string[])[] = [
  ["Right, I'd better go, dinner's burning.", 'Go! Speak soon.'],
  ['I need to sleep, talk tomorrow?', 'Yes, night night!'],
  ['Got to run, love you.', 'Love you too, bye!'],
  ['Okay, back to work for me.', 'Good luck, chat later.'],
  ['Anyway, I should get going.', 'Me too. Lovely to catch up!'],
  ['Battery dying, bye!', 'Bye!!'],
];

/** Facts about the filler people themselves (latency filler only, never in the questions' dialogues). */
const FILLER_FACTS: readonly (readonly string[])[] = [
  ['We finally adopted a {pet} from the rescue!', 'What did you call it?', '{petname}. It suits her.'],
  ['I started {hobby} lessons this week.', 'How was the first one?', 'Hard, but fun.'],
  ["We're moving to {place} in {month}.", "That's a big change!"],
  ['I got the job at {company}!', 'Congratulations!!'],
  ['My sister had her baby this morning, {baby} called {babyname}.', 'Congratulations, auntie!'],
  ['I ran my first {race} today.', 'How did it go?', 'Slow, but I finished!'],
  ['I broke my {part} falling off a ladder.', 'Ouch! Are you okay?', 'In a cast for six weeks.'],
  ['We got engaged at the weekend!', 'No way, congratulations!'],
  ['Booked a trip to {place} for {month}.', 'Lovely, you deserve it.'],
  ['Passed my {exam} exam!', 'Well done!'],
];

// ---------------------------------------------------------------------------------------------
// Dialogue specs

type Who = 0 | 1;
type Say = readonly [Who, string | readonly string[]];
interface Fact {
  key: string;
  lines: readonly Say[];
}
interface SessionSpec {
  date: string;
  facts: readonly Fact[];
}
interface QuestionSpec {
  kind: Kind;
  q: string;
  /** The answer; '@' = the date of the first evidence turn, '@-1' = the day before it. */
  a: string;
  /** `factKey` (its first line) or `factKey:lineIndex`. */
  ev: readonly string[];
}
interface DialogueSpec {
  id: string;
  speakers: readonly [string, string];
  sessions: readonly SessionSpec[];
  questions: readonly QuestionSpec[];
}

const f = (key: string, ...lines: Say[]): Fact => ({ key, lines });
const s = (date: string, ...facts: Fact[]): SessionSpec => ({ date, facts });
const single = (q: string, a: string, ...ev: string[]): QuestionSpec => ({ kind: 'single-hop', q, a, ev });
const multi = (q: string, a: string, ...ev: string[]): QuestionSpec => ({ kind: 'multi-hop', q, a, ev });
const temporal = (q: string, a: string, ...ev: string[]): QuestionSpec => ({ kind: 'temporal', q, a, ev });
const open = (q: string, a: string, ...ev: string[]): QuestionSpec => ({ kind: 'open-ended', q, a, ev });

// d1: Maya (a nurse in Manchester) and her old friend Jonas, who moves to Lisbon, then Porto.
const M = 0;
const J = 1;
const D1: DialogueSpec = {
  id: 'd1',
  speakers: ['Maya', 'Jonas'],
  sessions: [
    s(
      '2025-01-07',
      f(
        'puppy-plan',
        [
          M,
          [
            "Big news: we're adopting a puppy! The shelter in Stockport approved us today.",
            "Guess what, the rescue centre said yes, we're getting a puppy!",
          ],
        ],
        [J, ['No way! What kind?', "Stop it, that's amazing. What breed?"]],
        [
          M,
          [
            'Some sort of beagle mix, four months old and mostly ears.',
            'A beagle cross, they think. Four months, huge ears, very sad eyes.',
          ],
        ],
      ),
      f(
        'lisbon-interview',
        [
          J,
          [
            'I had a second interview for that job in Lisbon this week, fingers crossed.',
            'Remember the Lisbon job I applied for? Second round done, now I wait.',
          ],
        ],
        [M, ['Ooh, keep me posted!', 'Fingers and toes crossed for you.']],
      ),
    ),
    s(
      '2025-01-19',
      f('puppy-home', [
        M,
        [
          'We collected the puppy from the shelter this morning, he slept the whole drive home.',
          "He's here! Picked him up from the rescue this morning and he snored all the way back.",
        ],
      ]),
      f(
        'puppy-name',
        [J, ['Did you pick a name for him yet?', 'So what are you calling the little guy?']],
        [
          M,
          [
            'Yes, we call him Biscuit. Tom wanted Sir Barksalot but I vetoed it.',
            'Biscuit! Tom lobbied hard for Sir Barksalot, but no.',
          ],
        ],
      ),
    ),
    s(
      '2025-02-02',
      f(
        'jonas-lisbon',
        [
          J,
          [
            'I got the Lisbon job! Signed the contract this afternoon, I start at the bank in March.',
            'They offered me the job in Lisbon and I said yes! Contract signed today, I start at the bank on 3 March.',
          ],
        ],
        [M, ["JONAS. Congratulations! I'm so proud of you.", 'Amazing!! Portugal!!']],
      ),
      f(
        'bike',
        [
          M,
          [
            "Ines gave me her old road bike, she says she won't need it where she's going.",
            "Ines has passed her racing bike on to me since she's leaving the country soon.",
          ],
        ],
        [J, ["That's generous. Is it any good?", "Nice of her! What's it like?"]],
        [
          M,
          [
            'A steel Peugeot from the eighties, heavy but gorgeous.',
            "Old steel Peugeot, weighs a ton, but it's beautiful.",
          ],
        ],
      ),
    ),
    s(
      '2025-02-16',
      f(
        'allergy',
        [J, ["How was dinner at Ana's?", "How did the dinner party at Ana's go?"]],
        [
          M,
          [
            "Awful. My eyes swelled shut within an hour. Turns out I'm properly allergic to cats, and she has three.",
            "Not great, I was sneezing nonstop and my eyes puffed up. Apparently I'm allergic to cats, who knew. She has three of them.",
          ],
        ],
      ),
      f('jonas-flat', [
        J,
        [
          'Found a flat in Alfama, tiny but the view over the river is unreal.',
          "I've got a flat lined up in Alfama! Small, but you can see the river from the bed.",
        ],
      ]),
    ),
    s(
      '2025-03-04',
      f(
        'cello-start',
        [M, ['I had my first ever cello lesson tonight!', 'Guess who started cello lessons this evening? Me!']],
        [J, ['Cello?? Since when?', 'Wait, the cello? Since when do you play?']],
        [
          M,
          [
            "Since tonight, apparently. I've wanted to learn since school.",
            "Since about seven o'clock tonight, haha. I always wanted to learn.",
          ],
        ],
      ),
      f('cello-teacher', [
        M,
        [
          'My teacher is a lovely older man called Mr Haddad, endlessly patient with me.',
          'The teacher, Mr Haddad, is very patient, which is good because I was terrible.',
        ],
      ]),
      f('jonas-moved', [
        J,
        [
          "Writing to you from Lisbon! Moved in on Saturday and I'm still living out of boxes.",
          "I'm officially in Lisbon. Moved in at the weekend, boxes everywhere.",
        ],
      ]),
    ),
    s(
      '2025-03-22',
      f(
        'ines-move',
        [
          M,
          [
            "Said goodbye to Ines at the airport today, she's off to Utrecht to start her PhD.",
            'Dropped Ines at the airport this morning. Utrecht, here she comes, four years of PhD.',
          ],
        ],
        [J, ["Aw, you'll miss her.", 'That must have been sad.']],
      ),
      f(
        'sock',
        [
          M,
          [
            'Biscuit ate an entire sock, we spent half the night at the emergency vet.',
            "Spent most of last night at the out-of-hours vet because Biscuit swallowed one of Tom's socks.",
          ],
        ],
        [J, ['Oh no, is he okay?', 'Poor thing! Is he alright?']],
        [
          M,
          [
            "He's fine, it came out on its own. I'll spare you the details.",
            "Totally fine, it... reappeared. Let's leave it there.",
          ],
        ],
      ),
    ),
    s(
      '2025-04-06',
      f(
        'pottery',
        [
          M,
          [
            "Tom booked us a pottery evening class for my birthday. I made the wonkiest mug you've ever seen.",
            "For my birthday Tom got us a pottery class, and I've made a mug that leans like the tower of Pisa.",
          ],
        ],
        [J, ['I need a photo of this mug immediately.', 'Photo please, I need to see it.']],
      ),
      f('tax', [
        J,
        [
          'The tax office here wanted six different forms just to give me a tax number.',
          'Portuguese bureaucracy is something else. Three visits to the Finanças office and I still have no tax number.',
        ],
      ]),
    ),
    s(
      '2025-04-27',
      f(
        'haddad-orchestra',
        [
          M,
          [
            'Found out Mr Haddad plays in the Hallé! We went to watch him at the Bridgewater Hall on Friday.',
            'Mr Haddad is only a cellist in the Hallé orchestra! We saw him play on Friday.',
          ],
        ],
        [J, ["So he's a proper pro!", 'Wow, a real orchestra musician.']],
      ),
      f('accordion', [
        J,
        [
          'Our neighbour practises the accordion at seven every morning. Every. Single. Morning.',
          'The man upstairs plays accordion at 7am daily. I now know every song he knows.',
        ],
      ]),
    ),
    s(
      '2025-05-11',
      f(
        'proposal',
        [
          J,
          [
            'I have news... I proposed to Clara this morning, on the beach at Cascais.',
            'So. This morning, on the beach in Cascais, I asked Clara to marry me.',
          ],
        ],
        [M, ['WHAT. And??', 'Oh my god. And?!']],
        [J, ['She said yes!', "She said yes! We're engaged!"]],
      ),
      f('sofa', [
        M,
        [
          'Biscuit chewed through a sofa cushion while we were at work, foam everywhere.',
          'Came home to a living room full of foam. Biscuit has eaten a sofa cushion.',
        ],
      ]),
    ),
    s(
      '2025-05-30',
      f(
        'promotion',
        [
          M,
          [
            "I got the ward manager job! I start running the children's ward in June.",
            "They gave me the ward manager post! From June I'm in charge of the whole children's ward.",
          ],
        ],
        [J, ['Congratulations, boss!', 'Look at you! Congratulations!']],
      ),
      f('restructure', [
        J,
        [
          'The bank is restructuring, my whole team might be cut.',
          "Bad vibes at work, they're restructuring and our team is on the list.",
        ],
      ]),
    ),
    s(
      '2025-06-14',
      f(
        'porto-move',
        [
          J,
          [
            "Quick update: we're moving up north to Porto. Clara got offered a post at an architecture studio there, and my contract won't be renewed anyway.",
            "Change of plan, we're leaving Lisbon for Porto! Clara's been offered a job at an architecture practice up there, and the bank isn't renewing me.",
          ],
        ],
        [M, ['Another move! You two are nomads.', 'Honestly, that sounds lovely.']],
      ),
      f('bouldering', [
        M,
        [
          'I started bouldering with Priya from work, my forearms are dead.',
          "Priya from the ward dragged me to the climbing wall. I've started bouldering, my arms are jelly.",
        ],
      ]),
    ),
    s(
      '2025-06-29',
      f('porto-arrived', [
        J,
        ["We're officially Porto residents now, got the keys on Thursday.", 'Keys collected, we live in Porto now!'],
      ]),
      f('hills', [
        J,
        [
          "The hills here are brutal, I'm sweating every time I walk to the bakery.",
          'Nobody warned me Porto is basically vertical. My calves hate me.',
        ],
      ]),
      f('wine-job', [
        J,
        [
          "I've started at a wine export company, doing their IT and logistics software.",
          "New job: I'm running the systems at a port wine exporter in Gaia.",
        ],
      ]),
    ),
    s(
      '2025-07-13',
      f(
        'niece',
        [J, ['Any news from your sister?', "How's Lena doing, any sign of the baby?"]],
        [
          M,
          [
            'Yes!! Lena had a baby girl at 4am today. Rosa, 3.2 kilos, both doing great.',
            'She arrived this morning! A little girl called Rosa, 3.2 kilos, mum and baby both fine.',
          ],
        ],
      ),
      f('park', [
        M,
        [
          'Biscuit slipped his lead in Heaton Park and chased a squirrel for twenty minutes.',
          'Biscuit got out of his harness at the park and ran off after a squirrel. Twenty minutes of me shouting.',
        ],
      ]),
    ),
    s(
      '2025-07-27',
      f(
        'visit-plan',
        [
          M,
          [
            "I booked my flights, I'm coming to see you two in August!",
            "Flights booked! I'm visiting you and Clara in August.",
          ],
        ],
        [
          J,
          [
            "Finally! We'll take you on a boat up the Douro valley.",
            'Yes!! We have to do a boat trip along the Douro.',
          ],
        ],
      ),
      f('francesinha', [
        J,
        [
          "Clara says you have to try a francesinha, it's a sandwich drowned in beer sauce.",
          "Clara insists you eat a francesinha while you're here, it's a meat sandwich covered in cheese and sauce.",
        ],
      ]),
    ),
    s(
      '2025-08-10',
      f('landed', [
        M,
        ['Just landed at Porto airport! Where do I find you?', 'Landed in Porto! Which exit are you at?'],
      ]),
    ),
    s(
      '2025-08-24',
      f('back-home', [
        M,
        [
          'Back in Manchester, Biscuit went absolutely wild when he saw me.',
          'Home again. Biscuit cried with joy for ten minutes.',
        ],
      ]),
      f('douro-recap', [
        M,
        [
          'The Douro boat trip was the highlight, all those terraced vineyards.',
          'Still thinking about the boat on the Douro, those vineyards!',
        ],
      ]),
      f('cello-exam', [M, ['I passed my grade 1 cello exam, with merit!', 'Got my grade 1 cello result: merit!']]),
    ),
  ],
  questions: [
    single('What did Maya name the puppy she adopted?', 'Biscuit', 'puppy-name:1'),
    single("Which animals trigger Maya's allergy?", 'cats', 'allergy:1'),
    single('What position was Maya promoted to?', 'ward manager', 'promotion'),
    single('Which city does Jonas live in now?', 'Porto', 'porto-move', 'porto-arrived'),
    single("What is the name of Maya's newborn niece?", 'Rosa', 'niece:1'),
    single('What did Maya make at her first pottery class?', 'a wonky mug', 'pottery'),
    multi('Which city did the friend who gave Maya a bike move to?', 'Utrecht', 'bike', 'ines-move'),
    multi("Which orchestra does Maya's cello teacher play in?", 'the Hallé', 'cello-teacher', 'haddad-orchestra'),
    multi('What does the woman Jonas proposed to do for work?', 'she is an architect', 'proposal', 'porto-move'),
    multi('Where did Jonas live before he settled in Porto?', 'Lisbon', 'jonas-moved', 'porto-move'),
    multi('What breed is Biscuit?', 'a beagle mix', 'puppy-name:1', 'puppy-plan:2'),
    temporal('When did Maya bring the puppy home from the shelter?', '@', 'puppy-home'),
    temporal('When did Maya begin learning the cello?', '@', 'cello-start'),
    temporal('When did Jonas get engaged?', '@', 'proposal'),
    temporal("When was Maya's niece born?", '@', 'niece:1'),
    temporal('When did Maya arrive in Portugal to visit Jonas?', '@', 'landed'),
    temporal('When did Jonas accept the job offer in Lisbon?', '@', 'jonas-lisbon'),
    open(
      'What hobbies has Maya taken up this year?',
      'cello, pottery, bouldering',
      'cello-start',
      'pottery',
      'bouldering',
    ),
    open(
      "What kinds of trouble has Maya's dog gotten into?",
      'a sock, a cushion, a squirrel chase',
      'sock',
      'sofa',
      'park',
    ),
    open(
      'What has Jonas found annoying about living in Portugal?',
      'the tax forms, the accordion, the hills',
      'tax',
      'accordion',
      'hills',
    ),
    open(
      'What did Jonas and Clara recommend Maya do on her trip?',
      'a boat on the Douro, a francesinha',
      'visit-plan:1',
      'francesinha',
    ),
    open('What jobs has Jonas had this year?', 'at a bank, then at a wine exporter', 'jonas-lisbon', 'wine-job'),
  ],
};

// d2: Leo and Priya, designers at an agency in Leeds.
const L = 0;
const P = 1;
const D2: DialogueSpec = {
  id: 'd2',
  speakers: ['Leo', 'Priya'],
  sessions: [
    s(
      '2025-01-09',
      f(
        'run-start',
        [
          L,
          [
            'New year, new me: I went for my first run this morning. The couch-to-5k app nearly killed me.',
            'Did my first ever run today with one of those couch-to-5k apps. I thought I was going to die.',
          ],
        ],
        [P, ['Ha! Which week are you on?', 'Respect. How far did you get?']],
        [
          L,
          [
            'Week one, day one. Sixty seconds of jogging felt like a marathon.',
            'Eight rounds of one minute jogging. I had to lie down on the pavement after.',
          ],
        ],
      ),
      f('car-mot', [
        L,
        [
          'My car failed its MOT, the garage wants fourteen hundred quid to fix the rust.',
          'The Corsa failed its MOT. Rust everywhere, they want £1,400.',
        ],
      ]),
    ),
    s(
      '2025-01-23',
      f(
        'ebike',
        [P, ['Are you getting the car fixed in the end?', 'Did you decide what to do about the car?']],
        [
          L,
          [
            'Nope, scrapped it. Bought an electric bike instead, a blue one with a massive basket.',
            "Scrapped it and got an e-bike. It's blue, it has a basket, I love it.",
          ],
        ],
      ),
      f('mango', [
        P,
        [
          "My cat Mango has been drinking loads of water, I'm taking her to the vet on Friday.",
          'Mango, my cat, keeps emptying her water bowl. Vet appointment on Friday.',
        ],
      ]),
    ),
    s(
      '2025-02-06',
      f(
        'mango-diabetes',
        [L, ['How did the vet visit go?', 'What did the vet say in the end?']],
        [
          P,
          [
            "She's diabetic, poor thing. Insulin injections twice a day now.",
            'Diabetes. I have to inject her with insulin morning and evening now.',
          ],
        ],
      ),
      f('flatmate', [
        L,
        [
          "My flatmate Sam told me he's moving out in April.",
          "Bad news, Sam's giving up his room in our flat in April.",
        ],
      ]),
    ),
    s(
      '2025-02-20',
      f('wedding-plan', [
        P,
        [
          "I fly to Jaipur next Thursday for my brother's wedding, three days of ceremonies.",
          "Next week I'm off to Jaipur for Arjun's wedding. Three days of celebrations!",
        ],
      ]),
      f('new-manager', [
        P,
        [
          'Did you hear? Our new creative director starts Monday, someone called Owen from a London agency.',
          'The new creative director has been announced: Owen, ex-London agency, starts next week.',
        ],
      ]),
    ),
    s(
      '2025-03-06',
      f('wedding-back', [
        P,
        [
          "Back from India! Arjun's wedding was incredible, about four hundred guests.",
          'Home from Jaipur. The wedding was wild, something like 400 people came.',
        ],
      ]),
      f(
        'sourdough',
        [
          L,
          [
            "I've started baking sourdough, every weekend now.",
            "I've become a sourdough person. Baking every Saturday.",
          ],
        ],
        [P, ['Did you name your starter? Everyone does.', 'Please tell me you named the starter.']],
        [L, ['Obviously. Doughlores.', "Of course. She's called Doughlores."]],
      ),
    ),
    s(
      '2025-03-20',
      f(
        'owen-office',
        [
          P,
          [
            'Owen wants the whole team in the office on Tuesdays and Thursdays now.',
            'New rule from Owen: everyone in the office Tuesday and Thursday.',
          ],
        ],
        [L, ['So much for working in my pyjamas.', 'There goes my commute-free life.']],
      ),
      f('race-signup', [
        L,
        [
          'I signed up for the Leeds 10k in June, no backing out now.',
          "Entered the Leeds 10k! It's in June, someone stop me.",
        ],
      ]),
    ),
    s(
      '2025-04-03',
      f('sam-leaves', [
        L,
        [
          'Sam moved out yesterday, the flat is so quiet.',
          "Sam's room has been empty since yesterday. Weirdly quiet without him.",
        ],
      ]),
      f('driving-lessons', [
        P,
        [
          "I've booked driving lessons, finally. Thirty-two and never driven, it's embarrassing.",
          'Booked my first block of driving lessons. Yes, at 32.',
        ],
      ]),
    ),
    s(
      '2025-04-17',
      f('sam-glasgow', [
        L,
        [
          "Sam's settled in back in Glasgow, he's already complaining about the rain.",
          'Heard from Sam, Glasgow is treating him well apart from the weather.',
        ],
      ]),
      f(
        'hana',
        [
          L,
          [
            "Hana and I have decided she's moving in with me in June.",
            "Big news: Hana's going to move into the flat in June.",
          ],
        ],
        [P, ['Big step! Happy for you.', "Ahh, that's lovely!"]],
      ),
      f('talk-accept', [
        P,
        [
          'My talk got accepted for the UX conference in Lisbon in May!',
          "I'm speaking at the UX conference in Lisbon next month, they accepted my proposal!",
        ],
      ]),
    ),
    s(
      '2025-05-01',
      f('portuguese', [
        L,
        [
          "I've been doing Portuguese on Duolingo every day so I can order food when we visit Lisbon.",
          "I'm learning Portuguese! Forty-day streak on the app, for our Lisbon trip.",
        ],
      ]),
      f('driving-mock', [
        P,
        [
          "Had a mock test today, the instructor says I brake like I'm angry at the car.",
          'Mock driving test this afternoon. Apparently I brake like the car owes me money.',
        ],
      ]),
    ),
    s(
      '2025-05-15',
      f('talk-done', [
        P,
        [
          "I'm in Lisbon! Gave my talk this morning. My hands were shaking but people clapped.",
          'Talk done! Presented this morning here in Lisbon, nobody threw anything.',
        ],
      ]),
      f(
        'talk-topic',
        [L, ['What was the talk about again?', 'Remind me what you were presenting on?']],
        [
          P,
          [
            'Designing forms for people with dyslexia, based on our council project.',
            'Making forms easier for dyslexic users, the stuff we did for the council.',
          ],
        ],
      ),
    ),
    s(
      '2025-05-29',
      f('leo-lisbon', [
        L,
        [
          'Hana and I are in Lisbon for the long weekend, I ordered pastéis de nata in Portuguese!',
          'Long weekend in Lisbon with Hana. I asked for custard tarts in Portuguese and the lady understood me!',
        ],
      ]),
      f('mango-better', [
        P,
        [
          "Mango's blood sugar is finally stable, the vet is happy with her.",
          'Good news on Mango, her glucose levels have settled.',
        ],
      ]),
    ),
    s(
      '2025-06-12',
      f(
        'race',
        [L, ['Ran the Leeds 10k this morning: 52 minutes 40 seconds!', 'Finished the Leeds 10k today in 52:40!']],
        [
          P,
          ["Amazing for someone who couldn't run a minute in January!", 'From one minute of jogging to that, amazing.'],
        ],
      ),
      f('hana-moved', [
        L,
        [
          'Hana moved in at the weekend, her plants have taken over the living room.',
          "Hana's officially living here now. We own forty plants.",
        ],
      ]),
    ),
    s(
      '2025-06-26',
      f('driving-pass', [
        P,
        [
          'I PASSED my driving test today!! Only two minors.',
          'Passed my driving test this morning! Two minors, zero tears.',
        ],
      ]),
      f('owen-drinks', [
        P,
        [
          'Owen cancelled the Friday drinks budget, morale is great as you can imagine.',
          "Owen's cut the Friday drinks. The office is in mourning.",
        ],
      ]),
    ),
    s(
      '2025-07-10',
      f('chess', [
        L,
        [
          'I joined a chess club at the library, Tuesday nights. I lost every game.',
          'Went to the library chess club for the first time. Lost all four games to a twelve-year-old.',
        ],
      ]),
      f('priya-car', [
        P,
        ['Bought my first car, a little red Fiat 500, second hand.', "I'm a car owner! Secondhand red Fiat 500."],
      ]),
    ),
    s(
      '2025-07-24',
      f('cousin-maya', [
        P,
        [
          "My cousin Maya is visiting from Toronto next week. She's a dentist, so don't smile at her.",
          'Maya, my cousin from Toronto, arrives next week. Dentist. Very judgemental about teeth.',
        ],
      ]),
      f('senior', [L, ['I got the senior designer role!', 'They made me senior designer!']]),
    ),
    s(
      '2025-08-07',
      f('maya-visit', [
        P,
        [
          'Took Maya to Whitby at the weekend, we ate so many chips.',
          'Whitby day trip with Maya, fish and chips twice.',
        ],
      ]),
      f('half', [
        L,
        [
          "Signed up for the Leeds half marathon in October. Hana thinks I've lost it.",
          "I've entered the half marathon in October. Thirteen miles!",
        ],
      ]),
    ),
  ],
  questions: [
    single('What did Leo buy instead of repairing his car?', 'an electric bike', 'ebike:1'),
    single("How many guests were at Priya's brother's wedding?", 'about four hundred', 'wedding-back'),
    single('What did Leo name his sourdough starter?', 'Doughlores', 'sourdough:2'),
    single("What was Priya's conference talk about?", 'forms for people with dyslexia', 'talk-topic:1'),
    single("What was Leo's finishing time in the 10k?", '52:40', 'race'),
    single('What car did Priya buy?', 'a red Fiat 500', 'priya-car'),
    single("Who is Leo and Priya's new boss?", 'Owen', 'new-manager'),
    multi("What illness was Priya's cat diagnosed with?", 'diabetes', 'mango', 'mango-diabetes:1'),
    multi("Which city did Leo's former flatmate move back to?", 'Glasgow', 'flatmate', 'sam-glasgow'),
    multi(
      'What pastry did Leo order in the city where Priya gave her talk?',
      'pastéis de nata (custard tarts)',
      'talk-done',
      'leo-lisbon',
    ),
    multi('Where did Priya take her cousin who was visiting from Canada?', 'Whitby', 'cousin-maya', 'maya-visit'),
    multi(
      "What rule did Leo and Priya's new boss bring in?",
      'office on Tuesdays and Thursdays',
      'new-manager',
      'owen-office',
    ),
    temporal('When did Leo start running?', '@', 'run-start'),
    temporal('When did Priya give her talk in Lisbon?', '@', 'talk-done'),
    temporal('When did Leo run the Leeds 10k?', '@', 'race'),
    temporal('When did Priya pass her driving test?', '@', 'driving-pass'),
    temporal("When did Leo's flatmate move out?", '@-1', 'sam-leaves'),
    open(
      'What hobbies has Leo taken up this year?',
      'running, sourdough, Portuguese, chess',
      'run-start',
      'sourdough',
      'portuguese',
      'chess',
    ),
    open(
      'What has Priya complained about regarding her new boss?',
      'compulsory office days, cancelled Friday drinks',
      'owen-office',
      'owen-drinks',
    ),
    open(
      "How has Priya's cat been doing this year?",
      'thirsty, diagnosed diabetic, now stable',
      'mango',
      'mango-diabetes:1',
      'mango-better',
    ),
    open(
      'How has Priya got on with learning to drive?',
      'lessons, a mock test, passed, bought a Fiat',
      'driving-lessons',
      'driving-mock',
      'driving-pass',
      'priya-car',
    ),
    open('Which races has Leo entered?', 'the Leeds 10k, the half marathon', 'race-signup', 'race', 'half'),
  ],
};

// d3: Nora, a teacher in Bristol who moves to Bath, and Sam, a chef opening a restaurant.
const N = 0;
const S = 1;
const D3: DialogueSpec = {
  id: 'd3',
  speakers: ['Nora', 'Sam'],
  sessions: [
    s(
      '2025-01-12',
      f(
        'restaurant-plan',
        [
          S,
          [
            "I handed in my notice at the hotel today. I'm going to open my own place.",
            "Did it. Resigned from the hotel this morning, I'm opening my own restaurant.",
          ],
        ],
        [N, ["Sam! That's huge. What kind of food?", 'WHAT. Amazing. What will you cook?']],
        [
          S,
          [
            'Small plates, mostly wood-fired, Portuguese and Basque influences.',
            'Wood-fired small plates, a bit Portuguese, a bit Basque.',
          ],
        ],
      ),
      f('kitten-plan', [
        N,
        [
          "We're thinking of getting a kitten, the flat feels empty since Oscar died.",
          "The flat's so quiet without Oscar. We're looking at kittens.",
        ],
      ]),
    ),
    s(
      '2025-01-26',
      f(
        'kitten-name',
        [S, ["Did the kitten come home yet? What's she called?", "How's the new kitten? Name?"]],
        [
          N,
          [
            "She did, on Thursday. We named her Pickle, she's tiny and furious.",
            "Pickle! She's the size of my hand and attacks my feet.",
          ],
        ],
      ),
      f('hotel-years', [
        S,
        [
          'Last shift at the Harbour Hotel tonight. Eight years in that kitchen.',
          'Worked my final service at the Harbour Hotel tonight, after eight years there.',
        ],
      ]),
      f('swim', [
        N,
        [
          'I joined the open water swimming group at the lake. It was four degrees.',
          "I've started wild swimming with a group at the lake. Four degrees! I screamed.",
        ],
      ]),
    ),
    s(
      '2025-02-09',
      f('location', [
        S,
        [
          'We signed the lease on a unit on Gloucester Road today, an old bike shop.',
          "Lease signed this afternoon! It's a former bike shop on Gloucester Road.",
        ],
      ]),
      f('ines', [
        S,
        [
          'My girlfriend Ines is doing the wine list. She imports Portuguese wine for a living, so she knows every producer in the Douro.',
          'Ines, my other half, is putting the wine list together. Importing Portuguese wine is literally her job.',
        ],
      ]),
    ),
    s(
      '2025-02-23',
      f('house-offer', [
        N,
        [
          'We put an offer in on a little terraced house in Bath.',
          "We've made an offer on a terrace in Bath! Small garden, wonky stairs.",
        ],
      ]),
      f('choir', [
        N,
        [
          "I joined a community choir, we're doing Fleetwood Mac songs. Don't laugh.",
          'New thing: I sing in a community choir now. Fleetwood Mac medley. Stop laughing.',
        ],
      ]),
    ),
    s(
      '2025-03-09',
      f(
        'restaurant-name',
        [N, ['Have you settled on what to call the restaurant?', "So what's the place going to be called?"]],
        [S, ['Salt & Ember. Ines came up with it.', "We're going with Salt & Ember, it was Ines's idea."]],
      ),
      f('offer-accepted', [N, ['The offer on the Bath house got accepted!!', 'They accepted our offer on the house!']]),
    ),
    s(
      '2025-03-22',
      f('school-trip', [
        N,
        [
          'Just back from the school trip to Lisbon with thirty Year 9s, I need a week of sleep.',
          'Survived five days in Lisbon with thirty fourteen-year-olds. Barely.',
        ],
      ]),
      f('tram', [
        N,
        [
          'One of the kids left his passport on the 28 tram, we got it back somehow.',
          'A boy in my group lost his passport on a tram. The driver handed it in, miracle.',
        ],
      ]),
    ),
    s(
      '2025-04-12',
      f('breakup', [
        S,
        [
          "Ines and I split up. Mutual, mostly. She's still doing the wine list, weirdly.",
          "So Ines and I broke up last week. It's fine. She's still supplying the wine.",
        ],
      ]),
      f('moving-bath', [
        N,
        [
          'We moved into the Bath house today! Boxes everywhere.',
          "Moving day done, we're in the house in Bath! Sleeping on a mattress on the floor tonight.",
        ],
      ]),
    ),
    s(
      '2025-04-26',
      f('hire', [
        S,
        [
          'Hired my head chef today, Kenji. Ex-Nobu and terrifyingly calm.',
          'Found my head chef! Kenji starts Monday, he used to be at Nobu.',
        ],
      ]),
      f('commute', [
        N,
        [
          'The commute from Bath to school in Bristol is fifty minutes on the train, ugh.',
          'Train from Bath to my school in Bristol every day now. Fifty minutes each way.',
        ],
      ]),
    ),
    s(
      '2025-05-10',
      f('opening', [
        S,
        [
          'We opened tonight! Full house, the oven behaved, I might cry.',
          'Opening night done! Every table full, nothing caught fire.',
        ],
      ]),
      f('octopus', [
        N,
        ["The octopus was the best thing I've eaten all year.", "I'm still thinking about that grilled octopus."],
      ]),
    ),
    s(
      '2025-05-24',
      f('pickle-vet', [
        N,
        [
          'Pickle got spayed this week, she’s wearing a cone and hates us.',
          'Pickle had her operation at the vet, now she’s in a cone of shame.',
        ],
      ]),
      f('long-hours', [
        S,
        [
          "Working eighty-hour weeks, I've forgotten what daylight looks like.",
          "I haven't seen the sun in a week. Restaurant life.",
        ],
      ]),
    ),
    s(
      '2025-06-07',
      f('review', [
        S,
        [
          "The Bristol Post gave us four stars! They called the octopus 'quietly perfect'.",
          'Four-star review in the Bristol Post! The critic loved the octopus.',
        ],
      ]),
      f('swim-event', [
        N,
        [
          'Signed up for a two-mile swim in Windermere in September.',
          "I've entered a two-mile open water race on Windermere, September.",
        ],
      ]),
    ),
    s(
      '2025-06-21',
      f('wrist', [
        S,
        [
          'I broke my wrist this afternoon. Slipped on a wet floor in the kitchen, so embarrassing.',
          'A&E update: wrist broken. Slipped on a wet patch in the kitchen today.',
        ],
      ]),
      f('kenji-pass', [
        S,
        ["Kenji's running the pass while I'm in a cast.", 'Kenji is in charge of service until the cast comes off.'],
      ]),
    ),
    s(
      '2025-07-05',
      f(
        'marco',
        [N, ["So who's this Marco I keep seeing on your Instagram?", 'Who is the handsome man in all your stories?']],
        [
          S,
          [
            "Okay, fine, we've been on a few dates. He's a ceramicist, he made our plates actually.",
            "Marco. We're dating. He's a potter, he made all the restaurant's plates.",
          ],
        ],
      ),
      f('burn', [
        S,
        [
          'First week back on the line and I burned my forearm on the grill, of course.',
          "Back in the kitchen for three days and I've already burnt my arm on the grill.",
        ],
      ]),
    ),
    s(
      '2025-07-19',
      f('pregnant', [
        N,
        [
          "Don't tell anyone yet, but I'm pregnant! Due in January.",
          "Secret news: we're having a baby! Due in January.",
        ],
      ]),
      f('choir-gig', [
        N,
        [
          "Our choir sang at the harbour festival today, 'Dreams' went down a storm.",
          'The choir performed at the harbour festival this afternoon, people actually danced.',
        ],
      ]),
    ),
    s(
      '2025-08-02',
      f('second-site', [
        S,
        [
          "We're opening a second site, in Bath of all places, near you!",
          "Salt & Ember number two is happening, and it's in Bath!",
        ],
      ]),
      f('kenji-bath', [S, ["Kenji's going to run the kitchen in Bath.", 'Kenji will head up the Bath kitchen.']]),
    ),
    s(
      '2025-08-16',
      f('scan', [
        N,
        [
          "Had the scan today, everything looks healthy and it's a boy!",
          "Scan this morning: healthy, and we're having a boy!",
        ],
      ]),
      f('knee', [
        S,
        [
          'Tweaked my knee playing five-a-side with the kitchen team.',
          "Five-a-side with the kitchen lads and now my knee's the size of a melon.",
        ],
      ]),
    ),
  ],
  questions: [
    single('What did Nora call her new kitten?', 'Pickle', 'kitten-name:1'),
    single("What is Sam's restaurant called?", 'Salt & Ember', 'restaurant-name:1'),
    single("How did the local newspaper rate Sam's restaurant?", 'four stars', 'review'),
    single('What does the man Sam is dating do for a living?', 'ceramicist (potter)', 'marco:1'),
    single('Who did Sam hire to lead his kitchen?', 'Kenji', 'hire'),
    single('Which town does Nora live in now?', 'Bath', 'moving-bath'),
    multi(
      'How long had Sam worked at the job he quit to open his restaurant?',
      'eight years',
      'restaurant-plan',
      'hotel-years',
    ),
    multi("Who will run the kitchen at Sam's second restaurant?", 'Kenji', 'second-site', 'kenji-bath'),
    multi("In which town are both Nora's new home and Sam's second restaurant?", 'Bath', 'moving-bath', 'second-site'),
    multi(
      "What did one of Nora's students lose while she was abroad with her class, and in which city?",
      'a passport, in Lisbon',
      'school-trip',
      'tram',
    ),
    multi("What does Sam's ex-girlfriend do for a living?", 'imports Portuguese wine', 'ines', 'breakup'),
    temporal('When did Sam secure the premises for his restaurant?', '@', 'location'),
    temporal("When did Sam's restaurant open?", '@', 'opening'),
    temporal('When did Nora move into her house in Bath?', '@', 'moving-bath'),
    temporal('When did Sam break his wrist?', '@', 'wrist'),
    temporal("When did Nora learn she's expecting a boy?", '@', 'scan'),
    temporal('When did Sam quit his hotel job?', '@', 'restaurant-plan'),
    open('What hobbies has Nora taken up this year?', 'open water swimming, a choir', 'swim', 'choir'),
    open('What injuries has Sam had this year?', 'a broken wrist, a burn, a knee', 'wrist', 'burn', 'knee'),
    open(
      "How has Sam's love life changed this year?",
      'Ines, then a break-up, then Marco',
      'ines',
      'breakup',
      'marco:1',
    ),
    open(
      "What milestones has Sam's restaurant reached?",
      'lease, opening night, a four-star review, a second site',
      'location',
      'opening',
      'review',
      'second-site',
    ),
    open(
      'What has Nora told Sam about her cat?',
      'Oscar died, new kitten Pickle, spayed',
      'kitten-plan',
      'kitten-name:1',
      'pickle-vet',
    ),
  ],
};

// d4: Ines, a vet student in Edinburgh, and her dad Tom, retired in Galway, who buys a boat.
const I = 0;
const T = 1;
const D4: DialogueSpec = {
  id: 'd4',
  speakers: ['Ines', 'Tom'],
  sessions: [
    s(
      '2025-01-07',
      f(
        'boat-buy',
        [
          T,
          [
            "I've done something daft. I bought a boat today. A 1970s wooden sloop that needs everything redone.",
            "Don't tell your mother yet, but I bought a boat this morning. Old wooden sloop, needs a lot of love.",
          ],
        ],
        [I, ['Dad! Where are you going to keep it?', 'DAD. Where do you even put a boat?']],
        [
          T,
          [
            "Ciarán's letting me use his shed down at the harbour.",
            'In Ciarán’s big shed by the harbour, he owes me a favour.',
          ],
        ],
      ),
    ),
    s(
      '2025-01-21',
      f(
        'boat-name',
        [I, ['Did you decide on a new name for the boat?', 'Has the boat got a new name yet?']],
        [
          T,
          ["Marigold, after your gran's favourite flower.", "She's the Marigold now. Your gran would have liked that."],
        ],
      ),
      f('exam', [
        I,
        ['I have my anatomy exam on Friday, wish me luck.', "Anatomy exam on Friday, I'm revising bones in my sleep."],
      ]),
    ),
    s(
      '2025-02-04',
      f('exam-result', [
        I,
        ['Passed the anatomy exam! 71%, top quarter of the year.', 'Anatomy result is in: 71%! Top quarter!'],
      ]),
      f('knee-news', [
        T,
        [
          "The consultant says the left knee needs replacing, they'll do it in April.",
          'Saw the knee man. New left knee in April, apparently.',
        ],
      ]),
    ),
    s(
      '2025-02-18',
      f('leith', [
        I,
        [
          "I'm moving out of Marchmont at the end of the month, I found a room in a flat in Leith.",
          'Leaving Marchmont! Got a room in a flat down in Leith from March.',
        ],
      ]),
      f('watercolour', [
        T,
        [
          "I've taken up watercolours, the library runs a class on Wednesdays.",
          'Started a watercolour painting class at the library, Wednesday mornings.',
        ],
      ]),
    ),
    s(
      '2025-03-04',
      f('leith-moved', [
        I,
        [
          "First night in the Leith flat, the seagulls are louder than Galway's.",
          'Moved into the Leith place today. The gulls here are enormous.',
        ],
      ]),
      f('boat-hull', [
        T,
        [
          'Stripped the whole hull back to bare wood this week, my arms are in bits.',
          'Sanded the hull right down to the wood. Five days. My shoulders are gone.',
        ],
      ]),
    ),
    s(
      '2025-03-18',
      f(
        'callum',
        [T, ["So your mother says there's a young man?", "Your mother tells me you're seeing someone?"]],
        [I, ["Oh my god. Yes. Callum. He's in my year.", "Mum! Okay, yes, his name is Callum, he's on my course."]],
      ),
      f('paint-harbour', [
        T,
        [
          'Painted the harbour at dawn, it looks like a soggy biscuit.',
          'My painting of the harbour came out like a wet biscuit, but the teacher was kind.',
        ],
      ]),
    ),
    s(
      '2025-04-01',
      f('surgery', [
        T,
        [
          "They did the knee this morning. I'm on the ward and the morphine is lovely.",
          'New knee fitted today! Groggy, but the nurses are angels.',
        ],
      ]),
    ),
    s(
      '2025-04-15',
      f('physio', [
        T,
        [
          'Physio has me walking to the end of the corridor and back with a frame.',
          'The physio makes me do laps of the corridor with a zimmer frame.',
        ],
      ]),
      f('placement', [
        I,
        [
          'I got the summer placement on a sheep farm near Ullapool!',
          'My summer placement is confirmed: a hill farm with sheep, near Ullapool.',
        ],
      ]),
    ),
    s(
      '2025-04-29',
      f('walking', [
        T,
        ['Walked to the harbour without the crutches today.', 'Made it all the way to the harbour with no crutches!'],
      ]),
      f('callum-surgery', [
        I,
        [
          'Callum got a summer job at an equine hospital in Newmarket, he wants to be a horse surgeon.',
          "Callum's going to Newmarket for the summer, at a horse hospital. He's set on equine surgery.",
        ],
      ]),
    ),
    s(
      '2025-05-13',
      f('revision', [
        I,
        [
          'End of year exams start Monday, I basically live in the library now.',
          "Exams next week. I've moved into the library.",
        ],
      ]),
      f('mast', [
        T,
        [
          'Got the mast up on the boat, Ciarán and two lads from the pub helped.',
          'We stepped the mast today, took four of us and a lot of swearing.',
        ],
      ]),
    ),
    s(
      '2025-05-27',
      f('pepper-plan', [
        T,
        [
          "I've put my name down for a rescue greyhound, the house is too quiet.",
          'Applied to the greyhound rescue. The house needs a dog.',
        ],
      ]),
      f('prize', [
        I,
        [
          "I won the year prize for clinical skills! There's a £200 book token.",
          'Guess who won the clinical skills prize for our year? £200 of books!',
        ],
      ]),
    ),
    s(
      '2025-06-10',
      f(
        'pepper-home',
        [I, ["Did the greyhound arrive? What's she like?", 'Is the dog home yet?']],
        [
          T,
          [
            "She came home today. Pepper. She's already asleep on my good armchair.",
            'Pepper arrived this afternoon and has claimed the armchair.',
          ],
        ],
      ),
      f('placement-start', [
        I,
        [
          "Starting at the farm on Monday, there's no signal so I'll call from the village.",
          "Off to Ullapool on Monday. No phone signal on the farm, I'll ring from the pub.",
        ],
      ]),
    ),
    s(
      '2025-06-24',
      f('calving', [
        I,
        [
          'Helped with a difficult calving at 3am, I was up to my shoulder in a cow.',
          'Three in the morning, arm inside a cow, pulling out a calf. Best night ever.',
        ],
      ]),
      f('launch', [
        T,
        [
          'Launched the Marigold today! She floats. I may have cried.',
          "The boat went in the water this morning and she didn't sink!",
        ],
      ]),
    ),
    s(
      '2025-07-08',
      f('visit-plan', [
        T,
        [
          "I'll come over to Edinburgh on the 20th, I booked the ferry and the train.",
          'Booked my trip to see you in Edinburgh, arriving the 20th.',
        ],
      ]),
      f('sail', [
        T,
        [
          'Took the boat round the bay with Pepper in a life jacket.',
          'Sailed round the bay yesterday, Pepper wore a little life jacket.',
        ],
      ]),
    ),
    s(
      '2025-07-22',
      f('visit-recap', [
        I,
        [
          'It was so good having you here, Dad. Callum hasn’t stopped talking about your stories.',
          'Loved having you in Edinburgh. Callum wants to hear the shark story again.',
        ],
      ]),
      f('tattoo', [
        T,
        [
          'The Tattoo at the castle was something else, those pipers!',
          'Still humming the pipe bands from the Tattoo at the castle.',
        ],
      ]),
    ),
    s(
      '2025-08-05',
      f('callum-galway', [
        T,
        [
          "Callum's a grand lad. He fixed the bilge pump on the Marigold.",
          'That Callum is handy, he sorted the bilge pump in an afternoon.',
        ],
      ]),
      f('lisbon-dream', [
        T,
        [
          'Next summer I want to sail the Marigold down to Lisbon. Don’t tell your mother.',
          'Big plan for next year: sailing her all the way to Lisbon.',
        ],
      ]),
    ),
    s(
      '2025-08-19',
      f('exhibition', [
        T,
        [
          'Two of my watercolours are in the library exhibition!',
          "The library's hanging two of my paintings in their summer show!",
        ],
      ]),
      f('new-term', [
        I,
        [
          'Back to Edinburgh next week, fourth year starts.',
          'Fourth year starts on the first, heading back next week.',
        ],
      ]),
    ),
  ],
  questions: [
    single('What did Tom rename his boat?', 'Marigold', 'boat-name:1'),
    single('What mark did Ines get in her anatomy exam?', '71%', 'exam-result'),
    single("Who is Ines's boyfriend?", 'Callum', 'callum:1'),
    single('What is the name of the greyhound Tom rescued?', 'Pepper', 'pepper-home:1'),
    single('Where is Ines working over the summer for her course?', 'a sheep farm near Ullapool', 'placement'),
    single('Which part of Edinburgh does Ines live in now?', 'Leith', 'leith', 'leith-moved'),
    multi("What does Ines's boyfriend want to specialise in?", 'equine surgery', 'callum:1', 'callum-surgery'),
    multi('Whose shed is Tom restoring the Marigold in?', 'Ciarán’s', 'boat-buy:2', 'boat-name:1'),
    multi("What did Ines's boyfriend repair on the boat?", 'the bilge pump', 'callum:1', 'callum-galway'),
    multi("What did Tom's rescue dog wear on the boat trip?", 'a life jacket', 'pepper-home:1', 'sail'),
    multi("Where did Tom learn the art he's now exhibiting?", 'at the library', 'watercolour', 'exhibition'),
    temporal("When was Tom's knee replaced?", '@', 'surgery'),
    temporal("When did Tom's restored boat first go afloat?", '@', 'launch'),
    temporal('When did Tom bring his rescue dog home?', '@', 'pepper-home:1'),
    temporal('When did Ines move into her flat in Leith?', '@', 'leith-moved'),
    temporal('When did Tom buy the boat?', '@', 'boat-buy'),
    open('What work has Tom done on the boat?', 'stripped the hull, stepped the mast', 'boat-hull', 'mast'),
    open("How has Tom's recovery from his operation gone?", 'a walking frame, then no crutches', 'physio', 'walking'),
    open(
      'What has Ines achieved at university this year?',
      '71% in anatomy, a clinical skills prize',
      'exam-result',
      'prize',
    ),
    open(
      "How has Tom's painting been going?",
      'watercolour class, a harbour at dawn, an exhibition',
      'watercolour',
      'paint-harbour',
      'exhibition',
    ),
    open('What did Tom do during his visit to Edinburgh?', 'told his stories, saw the Tattoo', 'visit-recap', 'tattoo'),
  ],
};

const DIALOGUES: readonly DialogueSpec[] = [D1, D2, D3, D4];

// ---------------------------------------------------------------------------------------------
// Generation

interface Line {
  who: Who;
  text: string;
  ref?: string;
}

const pad = (n: number) => String(n).padStart(2, '0');

/** One session: greeting, small talk with the facts spread through it, goodbye. */
function buildSession(
  r: Rand,
  dialogue: string,
  index: number,
  date: string,
  speakers: readonly [string, string],
  facts: readonly Fact[],
  size: { min: number; max: number },
): { session: Session; refs: Map<string, string> } {
  const exchange = (lines: readonly string[]): Line[] => {
    const first: Who = r.chance(0.5) ? 0 : 1;
    return lines.map((t, k) => ({ who: ((first + k) % 2) as Who, text: fill(r, t) }));
  };
  const factLines = facts.map((fact) =>
    fact.lines.map(
      ([who, text], k): Line => ({
        who,
        text: typeof text === 'string' ? text : r.pick(text),
        ref: `${fact.key}:${k}`,
      }),
    ),
  );
  const target = r.int(size.min, size.max);
  let minute = r.int(7, 21) * 60 + r.int(0, 59);
  const opening = exchange(
    r.pick([...GREETINGS, ...(minute < 12 * 60 ? MORNING_GREETINGS : minute >= 17 * 60 ? EVENING_GREETINGS : [])]),
  );
  const closing = exchange(r.pick(GOODBYES));
  let budget = target - opening.length - closing.length - factLines.reduce((n, l) => n + l.length, 0);
  // Small talk goes into the gaps before, between and after the facts.
  const gaps: Line[][] = Array.from({ length: factLines.length + 1 }, () => []);
  while (budget > 0) {
    const talk = exchange(r.pick(SMALL_TALK));
    r.pick(gaps).push(...talk);
    budget -= talk.length;
  }
  const lines = [...opening, ...gaps.flatMap((g, k) => [...g, ...(factLines[k] ?? [])]), ...closing];
  const refs = new Map<string, string>();
  const turns = lines.map((line, k): Turn => {
    if (k > 0) minute = Math.min(23 * 60 + 59, minute + r.int(0, 3));
    const time = `${pad(Math.floor(minute / 60))}:${pad(minute % 60)}`;
    const id = `${dialogue}-s${pad(index)}-t${pad(k)}`;
    if (line.ref) refs.set(line.ref, id);
    return {
      id,
      dialogue,
      session: index,
      speaker: speakers[line.who],
      date,
      time,
      timestamp: `${date}T${time}`,
      text: line.text,
    };
  });
  return { session: { dialogue, index, date, speakers, turns }, refs };
}

const dayBefore = (date: string) => new Date(Date.parse(`${date}T00:00:00Z`) - 86_400_000).toISOString().slice(0, 10);

/** Words a question may not contain: the answer's own (a question paraphrases, it never gives the answer away). */
const NOT_ANSWER_WORDS = new Set([
  'the',
  'and',
  'for',
  'with',
  'from',
  'her',
  'his',
  'she',
  'near',
  'then',
  'new',
  'now',
  'about',
  'office',
]);
function answerWords(answer: string): string[] {
  return answer
    .toLowerCase()
    .split(/[^\p{L}\p{N}]+/u)
    .filter((w) => (/^\d+$/.test(w) ? w.length >= 2 : w.length >= 3) && !NOT_ANSWER_WORDS.has(w));
}

/** The data set for a seed (the default seed is the one the benchmark uses). */
export function recallData(seed = 2025): RecallData {
  const r = prng(seed);
  const sessions: Session[] = [];
  const questions: Question[] = [];
  for (const d of DIALOGUES) {
    const refs = new Map<string, string>();
    d.sessions.forEach((spec, index) => {
      const built = buildSession(r, d.id, index, spec.date, d.speakers, spec.facts, { min: 18, max: 30 });
      sessions.push(built.session);
      for (const [k, v] of built.refs) {
        if (refs.has(k)) throw new Error(`${d.id}: fact ${k} is defined twice`);
        refs.set(k, v);
      }
    });
    const turnsById = new Map(sessions.flatMap((x) => x.turns).map((t) => [t.id, t]));
    d.questions.forEach((q, k) => {
      const evidence = q.ev.map((e) => {
        const id = refs.get(e.includes(':') ? e : `${e}:0`);
        if (!id) throw new Error(`${d.id}: question "${q.q}" cites ${e}, which no session has`);
        return id;
      });
      const first = turnsById.get(evidence[0]!)!;
      const answer = q.a === '@' ? first.date : q.a === '@-1' ? dayBefore(first.date) : q.a;
      if (q.kind !== 'temporal') {
        const qWords = new Set(answerWords(q.q));
        const given = answerWords(q.a).filter((w) => qWords.has(w));
        if (given.length)
          throw new Error(`${d.id}: question "${q.q}" contains its answer's words (${given.join(', ')})`);
      }
      questions.push({ id: `${d.id}-q${pad(k + 1)}`, kind: q.kind, dialogue: d.id, question: q.q, answer, evidence });
    });
  }
  sessions.sort((a, b) => a.date.localeCompare(b.date) || a.turns[0]!.time.localeCompare(b.turns[0]!.time));
  return { sessions, turns: sessions.flatMap((x) => x.turns), questions };
}

// ---------------------------------------------------------------------------------------------
// The hand-written set (bench/recall-handwritten.json): another author and another method

interface WrittenSet {
  dialogues: {
    id: string;
    speakers: [string, string];
    sessions: { date: string; time: string; turns: { id: string; speaker: string; text: string }[] }[];
  }[];
  questions: Question[];
}

/**
 * Four conversations written whole, as prose, by a writer who saw neither Kiln's code nor the
 * generated set above, with 120 questions and the turns that answer them. The file gives each
 * session its start time; each turn here is one or two minutes after the one before it.
 */
export function handwrittenData(): RecallData {
  const raw = JSON.parse(
    readFileSync(fileURLToPath(new URL('./recall-handwritten.json', import.meta.url)), 'utf8'),
  ) as WrittenSet;
  const sessions: Session[] = [];
  for (const d of raw.dialogues)
    d.sessions.forEach((x, index) => {
      let [h, m] = x.time.split(':').map(Number) as [number, number];
      const turns = x.turns.map((t, i): Turn => {
        if (i > 0) m += 1 + (i % 2);
        h += Math.floor(m / 60);
        m %= 60;
        const time = `${pad(Math.min(h, 23))}:${pad(m)}`;
        return { ...t, dialogue: d.id, session: index, date: x.date, time, timestamp: `${x.date}T${time}` };
      });
      sessions.push({ dialogue: d.id, index, date: x.date, speakers: d.speakers, turns });
    });
  const ids = new Set(sessions.flatMap((x) => x.turns.map((t) => t.id)));
  for (const q of raw.questions) {
    if (!KINDS.includes(q.kind)) throw new Error(`${q.id}: unknown kind ${q.kind}`);
    for (const e of q.evidence) if (!ids.has(e)) throw new Error(`${q.id} cites ${e}, which no session has`);
  }
  sessions.sort((a, b) => a.date.localeCompare(b.date) || a.turns[0]!.time.localeCompare(b.turns[0]!.time));
  return { sessions, turns: sessions.flatMap((x) => x.turns), questions: raw.questions };
}

// ---------------------------------------------------------------------------------------------
// Daily logs

export interface DailyLog {
  path: string;
  date: string;
  text: string;
  /** Each turn's 1-based line number in `text`. */
  lineOf: Map<string, number>;
  /** The turns written to it, by id. */
  turns: Map<string, Turn>;
}

export const lineText = (t: Turn) => `- ${t.time} ${t.speaker}: ${t.text}`;

/** One `memory/YYYY-MM-DD.md` per day: `# date`, then per conversation a heading and one line per turn. */
export function dailyLogs(sessions: readonly Session[]): DailyLog[] {
  const byDate = new Map<string, Session[]>();
  for (const x of sessions) byDate.set(x.date, [...(byDate.get(x.date) ?? []), x]);
  return [...byDate.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([date, list]) => {
      const lines = [`# ${date}`];
      const lineOf = new Map<string, number>();
      const turns = new Map<string, Turn>();
      for (const x of [...list].sort((a, b) => a.turns[0]!.time.localeCompare(b.turns[0]!.time))) {
        lines.push('', `## Conversation between ${x.speakers[0]} and ${x.speakers[1]}`, '');
        for (const t of x.turns) {
          lines.push(lineText(t));
          lineOf.set(t.id, lines.length);
          turns.set(t.id, t);
        }
      }
      return { path: `memory/${date}.md`, date, text: `${lines.join('\n')}\n`, lineOf, turns };
    });
}

// ---------------------------------------------------------------------------------------------
// Filler for the latency part: the same kind of conversations between other people, earlier years

const FILLER_PEOPLE = [
  'Alice',
  'Ben',
  'Chloe',
  'Dan',
  'Ella',
  'Finn',
  'Grace',
  'Harry',
  'Isla',
  'Jack',
  'Kate',
  'Liam',
  'Mia',
  'Noel',
  'Olivia',
  'Ruby',
  'Theo',
  'Zoe',
  'Adam',
  'Bella',
  'Caleb',
  'Daisy',
  'Ethan',
  'Freya',
  'George',
  'Hannah',
  'Ivy',
  'Jake',
  'Lily',
  'Max',
  'Nina',
  'Erin',
  'Felix',
  'Gemma',
  'Hugo',
  'Iris',
  'Joel',
  'Kira',
  'Luke',
  'Megan',
];

/**
 * Daily logs of other people, one day at a time going back from `before` (exclusive): each day
 * has `sessions.min`–`sessions.max` short conversations between two of them, with a fact or two
 * of their own between the small talk.
 */
export function* fillerDays(
  seed: number,
  before: string,
  opts: { sessions: { min: number; max: number }; turns: { min: number; max: number } },
): Generator<Session[]> {
  const r = prng(seed);
  let day = before;
  let n = 0;
  for (;;) {
    day = dayBefore(day);
    const count = r.int(opts.sessions.min, opts.sessions.max);
    const list: Session[] = [];
    for (let k = 0; k < count; k++) {
      const a = r.pick(FILLER_PEOPLE);
      let b = r.pick(FILLER_PEOPLE);
      while (b === a) b = r.pick(FILLER_PEOPLE);
      const facts = Array.from(
        { length: r.int(0, 2) },
        (_, j): Fact => ({
          key: `x${j}`,
          lines: r.pick(FILLER_FACTS).map((t, i): Say => [(i % 2) as Who, fill(r, t)]),
        }),
      );
      list.push(buildSession(r, `f${n}`, k, day, [a, b], facts, opts.turns).session);
    }
    n++;
    yield list;
  }
}
