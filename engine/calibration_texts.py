"""The built-in calibration texts of the int8 mode's GPTQ rounding (`engine.calibration`): short
passages of several kinds a retrieval stage sees (questions, encyclopedic prose, product text,
code, dialogue, tables, other languages), written for this project."""

QUESTIONS = (
    "What is the difference between a reranker and an embedding model, and when should a search "
    "system use each of them?",
    "how to reset a router without the admin password",
    "best budget noise cancelling headphones for flights",
    "when did the first crewed moon landing happen",
    "symptoms of low iron",
    "how does a hash map handle collisions?",
    "Wie oft fährt die Bahn am Wochenende?",
    "notice period to end a rental agreement",
)

PASSAGES = (
    "The Rhine rises in the Swiss Alps, forms part of the border between Switzerland and "
    "Germany, and flows north through the Rhineland before reaching the North Sea in the "
    "Netherlands. For centuries it carried most of the trade of central Europe.",
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts, water is "
    "split, oxygen is released, and the energy captured is stored in sugars built from carbon "
    "dioxide taken from the air.",
    "This stainless steel kettle boils 1.7 litres in under four minutes. The handle stays cool, "
    "the lid opens with one hand, and it switches itself off when the water boils or the base "
    "runs dry. Two-year warranty.",
    "def merge(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]",
    "Customer: my order arrived yesterday but one of the two boxes is missing.\nAgent: I'm sorry "
    "about that. Could you give me the order number so I can check where the second box is?",
    "Symptoms of iron deficiency include tiredness, shortness of breath and pale skin. A blood "
    "test measuring ferritin confirms it; treatment is usually oral iron for three months.",
    "The tenant shall pay the rent monthly in advance on the first day of each month. Either "
    "party may end this agreement by giving the other two months' notice in writing.",
    "In 1969 the Apollo 11 mission landed the lunar module Eagle in the Sea of Tranquility. Neil "
    "Armstrong and Buzz Aldrin spent about two and a half hours outside, collecting 21.5 kg of "
    "samples, while Michael Collins orbited above.",
    "| city | population | area (km2) |\n| Tokyo | 14,094,034 | 2,194 |\n| Paris | 2,102,650 | "
    "105 |\n| Lagos | 15,388,000 | 1,171 |",
    "Le marché couvert ouvre à sept heures. On y trouve des fromages de la région, du pain "
    "encore chaud et des légumes cueillis le matin même.",
    "Die Bahn verkehrt werktags alle zehn Minuten; am Wochenende fährt sie nur jede halbe Stunde, "
    "und nach Mitternacht ersetzt ein Nachtbus die Strecke.",
    "SELECT customer_id, SUM(amount) AS total FROM payments WHERE paid_at >= '2024-01-01' "
    "GROUP BY customer_id HAVING SUM(amount) > 1000 ORDER BY total DESC;",
    "Is the following passage relevant to the query? Answer yes or no.\nQuery: side effects of "
    "ibuprofen\nPassage: Ibuprofen can irritate the stomach lining; take it with food.",
    "A hash table stores keys in buckets chosen by a hash function. Lookups take constant time "
    "on average, but many keys landing in one bucket degrade it, so tables grow and rehash when "
    "their load factor passes a threshold.",
    "Preheat the oven to 200 C. Toss the potatoes in olive oil, salt and rosemary, spread them on "
    "a tray in one layer, and roast for 40 minutes, turning them once halfway through.",
    "The central bank raised its policy rate by a quarter point to 4.5 percent, citing services "
    "inflation that has stayed above target, and signalled that further increases are possible.",
    "Q: Why is the sky blue? A: Sunlight scatters off air molecules, and shorter wavelengths "
    "scatter much more strongly than longer ones, so blue light reaches the eye from every "
    "direction of the sky.",
    "ERROR 2024-05-03T10:41:07Z worker-3 request_id=8f2c timeout after 30000 ms calling "
    "payments-api /v2/charge (attempt 3 of 3); circuit breaker opened for 60 s",
    "東京駅から新幹線で京都まで約二時間十五分です。",
    "The quarterback threw for 312 yards and three touchdowns as the home side came back from "
    "fourteen points down to win 31-27 with forty seconds left.",
    "Gradient descent updates each parameter against the gradient of the loss, scaled by a "
    "learning rate; momentum keeps a running average of past gradients to damp oscillation.",
)
