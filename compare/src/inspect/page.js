// palisade inspect --serve: fetches the rendered view again every refresh interval and swaps it
// in. Rendering stays on the server: this script knows nothing of locks.
(() => {
  const view = document.getElementById("view");
  const every = Number(view.dataset.refreshMs) || 2000;
  let failing = false;
  async function refresh() {
    try {
      const answer = await fetch("view", { cache: "no-store" });
      if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
      view.innerHTML = await answer.text();
      failing = false;
    } catch (e) {
      if (!failing) {
        const note = document.createElement("p");
        note.className = "error";
        note.setAttribute("role", "alert");
        note.textContent = `The page's server did not answer (${e.message}): the view below is older.`;
        view.prepend(note);
        failing = true;
      }
    } finally {
      setTimeout(refresh, every);
    }
  }
  setTimeout(refresh, every);
})();
