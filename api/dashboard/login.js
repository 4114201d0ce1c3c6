"use strict";
// The answer to a browser that asked for the dashboard without the API key. It asks for the
// key, keeps it in this tab's sessionStorage (a reload asks no more) and fetches the dashboard
// with it as a Bearer header, then writes that page over this one. The key is never put in an
// address, so no access log, history or Referer holds it.
(() => {
  const STORE = "scoring-api-key";
  const form = document.getElementById("login");
  const message = document.getElementById("message");

  async function open(key) {
    let answer;
    try {
      const headers = { Authorization: `Bearer ${key}` };
      answer = await fetch("dashboard", { headers, cache: "no-store" });
    } catch (error) {
      message.textContent = `the server cannot be reached: ${error.message}`;
      return;
    }
    if (!answer.ok) {
      sessionStorage.removeItem(STORE);
      message.textContent = answer.status === 401 ? "wrong key" : `answered ${answer.status}`;
      return;
    }
    sessionStorage.setItem(STORE, key);
    const page = await answer.text();
    document.open();
    document.write(page);
    document.close();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    open(form.elements.key.value);
  });
  const kept = sessionStorage.getItem(STORE);
  if (kept !== null) open(kept);
})();
